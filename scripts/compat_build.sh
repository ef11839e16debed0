#!/usr/bin/env bash
# Build librdkafka and the program of its own test suite (tests/test-runner) for `make compat`
# (scripts/compat.py runs it against a broker; docs/KAFKA.md, "librdkafka's own test suite").
#
# The source is Debian bookworm's source package of librdkafka 2.0.2, the version Debian's kcat
# links: CI machines reach Debian's archive and PyPI but not GitHub. It comes through a private
# apt configuration under the cache (one deb-src line, its own package lists and caches), so the
# machine's apt sources and caches are left as they are; `apt-get source` unpacks it with Debian's
# patches applied.
#
# Cached: the build lives in $COMPAT_DIR (default .compat/, gitignored) and a second run only checks
# that it is there. `rm -rf .compat` starts over. Needs root (or sudo) for the build dependencies.
set -euo pipefail

cd "$(dirname "$0")/.."
CACHE=${COMPAT_DIR:-$(pwd)/.compat}
VERSION=2.0.2
DEB_VERSION=$VERSION-1
SRC=$CACHE/librdkafka-$VERSION
RUNNER=$SRC/tests/test-runner
STAMP=$CACHE/.built-$DEB_VERSION

say() { printf '[compat-build] %s\n' "$*"; }

if [ -x "$RUNNER" ] && [ -f "$STAMP" ]; then
    say "librdkafka $VERSION and its test-runner are built: $RUNNER"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else SUDO="skip"; fi
fi

# The build dependencies of Debian's package (debian/control) less debhelper and SASL/GSSAPI,
# which a plaintext broker does not need; dpkg-dev unpacks the source package.
PKGS=(g++ make pkg-config python3 dpkg-dev zlib1g-dev libssl-dev libzstd-dev liblz4-dev rapidjson-dev)
missing=()
for p in "${PKGS[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$SUDO" = "skip" ]; then
        say "missing packages and no root or sudo to install them: ${missing[*]}"
        exit 1
    fi
    say "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

mkdir -p "$CACHE"
if [ ! -f "$SRC/tests/test.c" ]; then
    APT=$CACHE/apt
    mkdir -p "$APT/lists/partial" "$APT/archives/partial" "$APT/sources.list.d" "$APT/cache"
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main" \
        > "$APT/sources.list"
    apt_opts=(
        -o "Dir::Etc::SourceList=$APT/sources.list"
        -o "Dir::Etc::SourceParts=$APT/sources.list.d"
        -o "Dir::State::Lists=$APT/lists"
        -o "Dir::Cache=$APT/cache"
        -o "Dir::Cache::Archives=$APT/archives"
        # apt's sandbox user cannot write into a root-owned cache; the download is still verified
        -o "APT::Sandbox::User=root"
    )
    say "apt-get source librdkafka=$DEB_VERSION (Debian bookworm, into $CACHE)"
    # Everything it writes is under $APT (its lists, its caches), so no root is needed here.
    apt-get "${apt_opts[@]}" update -qq
    rm -rf "$SRC"
    (cd "$CACHE" && apt-get "${apt_opts[@]}" source -qq "librdkafka=$DEB_VERSION" >/dev/null)
fi

jobs=$(nproc)
say "building librdkafka $VERSION and tests/test-runner ($jobs jobs; a few minutes, once)"
cd "$SRC"
# No downloads at configure time (mklove fetches modules and dependencies from GitHub otherwise);
# no libcurl (OIDC) or GSSAPI: the suite's tests of those skip themselves without their servers.
./configure --no-download --disable-curl --disable-gssapi >"$CACHE/configure.log" 2>&1 \
    || { tail -30 "$CACHE/configure.log"; exit 1; }
make -j"$jobs" libs >"$CACHE/make.log" 2>&1 || { tail -30 "$CACHE/make.log"; exit 1; }
make -j"$jobs" -C tests build >>"$CACHE/make.log" 2>&1 || { tail -30 "$CACHE/make.log"; exit 1; }
touch "$STAMP"
say "built: $RUNNER"

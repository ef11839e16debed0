#!/usr/bin/env bash
# The stream processors tests/apps runs against `broker serve`, each in a venv of its own under
# $1/apps/<name> ($1: the project's venv): their pins conflict with the project's (quixstreams
# wants confluent-kafka<2.13, the project pins 2.16.1) and with each other's. Exact versions, so
# CI tests what docs/KAFKA.md ("Stream processors") names; a venv already holding its pin is left
# alone (a stamp file beside it), so the cost is paid once per machine.
set -euo pipefail

VENV=${1:?usage: setup_apps.sh PROJECT_VENV}
APPS="$VENV/apps"
say() { printf '[setup] %s\n' "$*"; }

# name -> pip requirements (bytewax's Kafka connector runs on confluent-kafka, its kafka extra).
declare -A WANT=(
    [quixstreams]="quixstreams==3.28.1"
    [faust]="faust-streaming==0.15.3"
    [bytewax]="bytewax[kafka]==0.21.1"
)
for name in quixstreams faust bytewax; do
    dir="$APPS/$name"
    want="${WANT[$name]}"
    if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$want" ] && [ -x "$dir/bin/python" ]; then
        say "$want present in $dir"
        continue
    fi
    say "venv $dir with $want"
    rm -rf "$dir"
    "$VENV/bin/python" -m venv "$dir"
    # A failed install fails the setup: tests/apps would otherwise skip, and a skipped check is
    # no check.
    "$dir/bin/python" -m pip install -q "$want"
    echo "$want" > "$dir/.installed"
done

#!/usr/bin/env bash
# `make spark-demo`: generate a dataset, ingest it into a fresh broker with Spark, export it back to
# Parquet, print both throughputs. Everything lives under $DEMO_DIR (default .spark-demo/) and the
# broker is stopped at the end. DEMO_MB (default 300) sizes the dataset, PARTITIONS (default 4) the
# topic, FORMAT (csv|json|parquet, default csv) the input, BACKEND (default auto: io_uring where it
# works) the broker's backend.
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO_DIR=${DEMO_DIR:-.spark-demo}
DEMO_MB=${DEMO_MB:-300}
PARTITIONS=${PARTITIONS:-4}
FORMAT=${FORMAT:-csv}
PY=.venv/bin/python
SUBMIT=.venv/bin/spark-submit
export PYSPARK_PYTHON="$PWD/$PY"

rm -rf "$DEMO_DIR" && mkdir -p "$DEMO_DIR"
"$PY" -m broker.cli serve --data-dir "$DEMO_DIR/data" --port 0 --backend "${BACKEND:-auto}" > "$DEMO_DIR/broker.log" 2>&1 &
BROKER=$!
trap 'kill -TERM $BROKER 2>/dev/null; wait $BROKER 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    PORT=$(grep -oE 'serving on [0-9.]+:[0-9]+' "$DEMO_DIR/broker.log" | grep -oE '[0-9]+$' || true)
    [ -n "$PORT" ] && break
    sleep 0.1
done
[ -n "${PORT:-}" ] || { cat "$DEMO_DIR/broker.log"; exit 1; }
echo "[spark-demo] broker on 127.0.0.1:$PORT, data in $DEMO_DIR"
"$SUBMIT" --master "local[*]" --conf spark.ui.showConsoleProgress=false --conf spark.log.level=WARN scripts/spark_ingest.py \
    --bootstrap "127.0.0.1:$PORT" --topic events --partitions "$PARTITIONS" \
    --input "$DEMO_DIR/events.$FORMAT" --generate-mb "$DEMO_MB" --key-column user_id 2>&1 | grep -v ' WARN \|log4j'
"$SUBMIT" --master "local[*]" --conf spark.ui.showConsoleProgress=false --conf spark.log.level=WARN scripts/spark_export.py \
    --bootstrap "127.0.0.1:$PORT" --topic events --output "$DEMO_DIR/events-out.parquet" \
    --value-as-string 2>&1 | grep -v ' WARN \|log4j'

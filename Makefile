# The two commands a newcomer needs are `make run` and `make test` (see README.md).
# Both set the machine up first; scripts/setup.sh is idempotent and cheap once done.
PY := .venv/bin/python
# The layers of docs/ARCHITECTURE.md ("Rooms and layers"), as import-linter contracts in pyproject.toml.
LINT_IMPORTS := .venv/bin/lint-imports --no-cache --no-logo
DATA_DIR ?= ./data
# The test order's seed (pytest-randomly): a new one each run unless given.
ifndef SEED
SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif

.PHONY: setup run test lint bench clean spark-demo bench-spark bench-kafka cluster-demo bench-perf bench-security bench-txn bench-scale compat

setup:
	@bash scripts/setup.sh

run: setup
	$(PY) -m broker.cli serve --data-dir $(DATA_DIR)

test: setup
	$(PY) -m ruff check .
	$(LINT_IMPORTS)
	$(PY) -m mypy
	# Three workers, each running whole files (module fixtures such as a cluster or a SparkSession
	# start once; tests that change the kernel, namespaces and XDP, already clean up after
	# themselves and name what they make per process): the suite's 20-minute budget. Three on 2
	# CPUs, because a test spends much of its time waiting on a broker's start, a timer or a
	# session: with two the CPUs were 63% busy and the suite took 25 min on the 2-CPU VM, with
	# three 84% and 20. The 40 slowest tests are listed to keep it. pytest-randomly shuffles the files and the tests in
	# each, so a test that passes only beside its neighbours fails here; SEED=n replays an order.
	@echo "test order: pytest-randomly seed $(SEED) (make test SEED=$(SEED) replays it)"
	$(PY) -m pytest -q -n 3 --dist loadfile --durations=40 -p randomly --randomly-seed=$(SEED)

lint: setup
	$(PY) -m ruff check .
	$(LINT_IMPORTS)
	$(PY) -m mypy
	$(PY) -m ruff format --check .

bench: setup
	$(PY) bench/storage.py

# Spark (docs/SPARK.md): generate ~DEMO_MB MB of CSV, ingest it into a fresh broker's topic with
# Spark, export the topic to Parquet; both print their throughput.
spark-demo: setup
	bash scripts/spark_demo.sh

bench-spark: setup
	$(PY) bench/spark.py

# The performance targets in one run (docs/PERFORMANCE.md): both backends beside Redis (latency,
# durability, ingest, fetch); QUICK=1 for ~3 minutes.
bench-perf: setup
	$(PY) bench/perf.py $(if $(QUICK),--quick)

# What TLS and SASL cost (docs/SECURITY.md, "Figures"): librdkafka against plaintext, TLS and
# TLS+SCRAM brokers on both backends; QUICK=1 for ~1 minute.
bench-security: setup
	$(PY) bench/security.py $(if $(QUICK),--quick)

# librdkafka against ringlog and Tansu (docs/KAFKA.md, "Side by side"); QUICK=1 for small sizes.
bench-kafka: setup
	$(PY) bench/kafka_clients.py $(if $(QUICK),--quick)

# Kafka transactions on one node (docs/PERFORMANCE.md, "Transactions"): librdkafka's transactional
# throughput against idempotent produce, read_committed latency, recovery after kill -9 of the
# coordinator; both backends, ~16 minutes on a loaded VM. QUICK=1 for ~5.
bench-txn: setup
	$(PY) bench/transactions.py $(if $(QUICK),--quick)

# The cost of scale (docs/PERFORMANCE.md): replication against one node (CPU per replicated GB, the
# follower fetch), 100k partitions on a node (create, restart, RSS, descriptors, Metadata, passes),
# produce spread over 1000 partitions, a 50-member group, and how each grows; one table of goals.
# Long in full; QUICK=1 for ~5 minutes (20k partitions, or what the free disk allows).
bench-scale: setup
	$(PY) bench/scale.py $(if $(QUICK),--quick)

# librdkafka's own test suite against a fresh broker, one test per process (docs/KAFKA.md,
# "librdkafka's own test suite"): per-test results and the totals. The first run builds librdkafka
# 2.0.2 from Debian's source package into .compat/ (a few minutes); ONLY=0001,0012 runs those
# tests, QUICK=1 the suite's quick mode (fewer subtests). Not part of `make test`: it is long.
compat: setup
	bash scripts/compat_build.sh
	$(PY) scripts/compat.py $(if $(ONLY),--tests $(ONLY)) $(if $(QUICK),--quick)

# Three nodes in network namespaces (root), a producer and a consumer, the leader killed and
# restarted: prints leaders before/after, failover time, records, the checker's verdict.
cluster-demo: setup
	$(PY) scripts/cluster_demo.py

clean:
	rm -rf .venv build *.egg-info .pytest_cache .ruff_cache .mypy_cache .hypothesis .compat

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# uv builds the venvs: it downloads in parallel and keeps one cache for all of them (a fresh
# clone's pyspark wheels are built from their sources once). A fresh machine has no uv: pip
# installs it into a venv of its own first.
UV_VENV ?= .venv-uv
UV := $(UV_VENV)/bin/uv
# $(call new-venv,<dir>,<requirements>[,<prefix>]): a venv with pip in it (tests/install runs
# `python -m pip`) and the requirements, as pip would install them; the install command run
# under <prefix> (`nice`: a venv needed later gives the cores to the tests already running).
# pyspark comes as sources, its jars inside: its wheel is built here, once per version, and
# stored, not deflated (jars are compressed already: a build and install 30.5 -> 15.6
# CPU-seconds; the files installed are the same).
PYSPARK_WHEEL_STORED := --config-settings-package 'pyspark:--build-option=--compression=stored'
new-venv = rm -rf $(1) && $(UV) venv --quiet --seed --python python3 $(1) && \
	VIRTUAL_ENV=$(abspath $(1)) $(3) $(UV) pip install --quiet $(PYSPARK_WHEEL_STORED) $(2)

# Every Python process make starts writes the bytecode of what it imports, where the
# environment says not to (PYTHONDONTWRITEBYTECODE, as on this project's machines): else each
# one compiles pyspark, pandas and pyarrow from source again (the worker a Connect server
# starts per foreachBatch query imported in 2.5 s instead of 0.7 s, and Spark 4.0 gives it a
# fixed 10 s to connect back). Written on first import, only what is imported: compiling
# every file of a venv at install (uv's --compile-bytecode) cost about 54 CPU-seconds a venv.
unexport PYTHONDONTWRITEBYTECODE

# `make demo` runs on its own venv: the package with its runtime dependencies and pyspark (the
# `spark` extra), none of the dev tools.
DEMO_VENV ?= .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed

# The Kafka tests (pytest marker `kafka`) run on a second venv: Spark's Kafka source is published
# on Maven Central for pyspark 4.2.0 at the newest (none for 4.3). Same package, editable, dev extras.
KAFKA_SPARK ?= 4.2.0
KAFKA_VENV ?= .venv-spark4.2
KAFKA_PY := $(KAFKA_VENV)/bin/python
KAFKA_STAMP := $(KAFKA_VENV)/.installed

# JVM jars, fetched once from Maven Central by `mvn` into .jars/<set>/ (git-ignored): one small
# pom per set under jvm/<set>/, its runtime dependencies copied beside it; a stamp marks it done.
# One set after another (each waits for the one before: Maven's local repository is shared),
# beside the venvs when make runs jobs in parallel.
JARS := .jars
MVN ?= mvn
comma := ,
DEPENDENCY_PLUGIN := org.apache.maven.plugins:maven-dependency-plugin:3.8.1
# $(call fetch-jars,<pom>,<output dir>,<extra mvn flags>)
fetch-jars = rm -rf $(2) && $(MVN) -q -B -f $(1) $(3) \
	$(DEPENDENCY_PLUGIN):copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(2)
KAFKA_JARS := $(JARS)/kafka/.fetched
DEBEZIUM_JARS := $(JARS)/debezium/.fetched
SPARK_KAFKA_JARS := $(JARS)/spark-kafka-$(KAFKA_SPARK)/.fetched
# Spark's own Delta (delta-spark 4.4: built for Spark 4.0-4.2, none for 4.3), for the tests
# marked `delta_spark`; they run on the same venv as the Kafka tests.
DELTA_JARS := $(JARS)/delta-$(KAFKA_SPARK)/.fetched
# Hadoop's S3A connector (hadoop-aws and its AWS SDK bundle, about 690 MB) at the Hadoop that
# pyspark $(KAFKA_SPARK) ships (pyspark/jars/hadoop-client-api-3.5.0.jar), for `s3a://` in the
# tests marked `delta_spark` (the sink taking its S3 settings from the session's fs.s3a.*).
HADOOP_AWS_VERSION ?= 3.5.0
HADOOP_AWS_JARS := $(JARS)/hadoop-aws-$(KAFKA_SPARK)/.fetched
# The pyspark releases `make smoke` checks, one venv each (.venv-spark<major.minor>; 4.2's is
# the Kafka venv). `make test` checks them all: its main suite runs the smoke tests on 4.3.
SMOKE_SPARKS ?= 3.5.9 4.0.1 4.1.4 4.2.0
TEST_SMOKE_SPARKS ?= $(SMOKE_SPARKS)
# pyspark 3.5's wheel has no Spark Connect server (4.0 added it): Spark's plugin jar for the 3.5
# line, put into the local Maven repository, where the tests' session finds it. 3.5.7 is
# the newest 3.5 plugin on the Maven Central this project's machines reach.
CONNECT_PLUGIN_3.5 ?= 3.5.7

.PHONY: demo demo-kafka demo-cdc wheel jars test test-setup test-lane-main test-lane-others test-lane-install test-main-suite test-kafka-venv-suite test-main test-install test-kafka test-cdc test-delta-spark race smoke lint bench bench-quick bench-append bench-consumer bench-lookup bench-lookup-pass bench-checkpoint bench-scale bench-cluster soak soak-quick soak-exit soak-faults clean

$(UV):
	python3 -m venv $(UV_VENV)
	$(UV_VENV)/bin/python -m pip install --quiet uv
	touch $@

$(STAMP): pyproject.toml | $(UV)
	$(call new-venv,$(VENV),-e '.[dev]')
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml | $(UV)
	$(call new-venv,$(DEMO_VENV),-e '.[spark]')
	touch $@

$(KAFKA_STAMP): pyproject.toml | $(UV)
	$(call new-venv,$(KAFKA_VENV),'pyspark==$(KAFKA_SPARK)' -e '.[dev]')
	touch $@

# The smoke suite's venvs, one per pyspark of $(SMOKE_SPARKS) but 4.2 (the Kafka venv): the
# package with the `test` extra. Spark 3.5's also has the oldest pyarrow pyproject.toml allows,
# as a platform's Spark 3.5 brings it (pyarrow's writer takes Parquet bloom filters from 24 on).
PYARROW_FLOOR ?= 16.1.0
smoke-venv = .venv-spark$(basename $(1))/.installed
SMOKE_STAMPS = $(foreach v,$(filter-out $(KAFKA_SPARK),$(SMOKE_SPARKS)),$(call smoke-venv,$(v)))
# `make test` sets SMOKE_AFTER to the class-data archive the main lane waits for: the smoke
# venvs, needed last, are built after it, leaving the job slots and the network to what starts
# the lanes (on a fresh clone the main lane's archive had waited for a smoke venv's slot).
SMOKE_AFTER ?=
.venv-spark%/.installed: pyproject.toml | $(UV) $(SMOKE_AFTER)
	$(call new-venv,.venv-spark$*,'pyspark==$(filter $*.%,$(SMOKE_SPARKS))' \
	  $(if $(filter 3.5,$*),'pyarrow==$(PYARROW_FLOOR)') -e '.[test]',nice -n 10)
	touch $@

# $(call fetch-jar-sets,<modules of jvm/pom.xml>,<their stamps>): one Maven run (one JVM start
# and one resolution) copies each set's runtime jars into the directory its pom names under
# $(JARS), the old copies removed first.
fetch-jar-sets = rm -rf $(dir $(2)) && $(MVN) -q -B -f jvm/pom.xml -pl $(1) \
	-Dspark.version=$(KAFKA_SPARK) -Dhadoop.version=$(HADOOP_AWS_VERSION) -Djars.dir=$(CURDIR)/$(JARS) \
	$(DEPENDENCY_PLUGIN):copy-dependencies && touch $(2)

# An Apache Kafka broker (kafka_2.13 and its dependencies, log4j2) and Spark's Kafka source at
# the Kafka venv's pyspark version: what `make demo-kafka` needs.
$(KAFKA_JARS) $(SPARK_KAFKA_JARS) &: jvm/pom.xml jvm/kafka/pom.xml jvm/spark-kafka/pom.xml
	$(call fetch-jar-sets,kafka$(comma)spark-kafka,$(KAFKA_JARS) $(SPARK_KAFKA_JARS))

# delta-spark and its runtime dependencies, and hadoop-aws (named by the Kafka venv's pyspark,
# as the sets the session loads), for the Kafka venv's pyspark. After the first group: two Maven
# runs at once would share the local repository.
$(DELTA_JARS) $(HADOOP_AWS_JARS) &: jvm/pom.xml jvm/delta/pom.xml jvm/hadoop-aws/pom.xml | $(SPARK_KAFKA_JARS)
	$(call fetch-jar-sets,delta$(comma)hadoop-aws,$(DELTA_JARS) $(HADOOP_AWS_JARS))

# A Kafka Connect worker with Debezium's PostgreSQL connector, for the change-event tests
# (tests/kafka/test_debezium_pipeline.py). After the other groups: one local repository.
$(DEBEZIUM_JARS): jvm/pom.xml jvm/debezium/pom.xml | $(DELTA_JARS)
	$(call fetch-jar-sets,debezium,$(DEBEZIUM_JARS))

jars: $(KAFKA_JARS) $(SPARK_KAFKA_JARS) $(DELTA_JARS) $(HADOOP_AWS_JARS) $(DEBEZIUM_JARS)

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/compacted-sink demo --lake lake-demo

# A local broker started and stopped by the demo itself (streaming/inputs/local_kafka.py): the
# broker's jars and Spark's Kafka source, nothing else.
demo-kafka: $(KAFKA_STAMP) $(KAFKA_JARS) $(SPARK_KAFKA_JARS)
	$(KAFKA_PY) examples/kafka_demo.py --lake lake-demo-kafka

# PostgreSQL, a broker and Debezium's connector in a Connect worker, started and stopped by the
# demo itself (examples/debezium_demo.py): the state follows the table and ends equal to it.
demo-cdc: $(KAFKA_STAMP) $(KAFKA_JARS) $(SPARK_KAFKA_JARS) $(DEBEZIUM_JARS)
	$(KAFKA_PY) examples/debezium_demo.py --lake lake-demo-cdc

# The wheel (dist/compacted_sink-<version>-py3-none-any.whl): what a cluster, a Databricks job's
# library or `pip install` beside a platform's Spark takes; and the same file as
# dist/compacted_sink.zip for `spark-submit --py-files`, which puts only .zip, .egg and .jar
# files on the executors' Python path.
wheel:
	rm -f dist/compacted_sink-*.whl
	python3 -m pip wheel --quiet --no-deps --wheel-dir dist .
	cp dist/compacted_sink-*.whl dist/compacted_sink.zip
	@ls dist/compacted_sink-*.whl dist/compacted_sink.zip

# `make test`: two lanes side by side, each started as soon as its own venv and jars are there
# (the rest of the set-up goes on beside the tests: it waits on the network more than on the
# cores), and the install tests beside them. The main lane: the main suite on $(VENV), then the
# smoke suite on the Sparks of $(MAIN_LANE_SMOKE). The other lane: the Kafka, delta-spark and (when
# $(TEST_SMOKE_SPARKS) holds $(KAFKA_SPARK)) smoke tests on $(KAFKA_VENV), then the smoke
# suite on the other Sparks. Every part runs, prints its wall time (`== <part>: N s`, for finding
# what bounds the whole) and leaves its exit status in $(RESULTS)/<part>; each lane's output
# is printed when it ends; the target fails when any part or venv does, naming it.
# TEST_JOBS=1 runs one thing at a time.
TEST_JOBS ?= 5
# The split that ends both lanes closest together on a fresh clone: the other lane starts first
# (it waits for no class-data archive) and takes two smoke runs, the main lane one (figures:
# docs/benchmarks.md, "The test run's cost, by date").
MAIN_LANE_SMOKE ?= 4.1.4
OTHER_LANE_SMOKE = $(filter-out $(KAFKA_SPARK) $(MAIN_LANE_SMOKE),$(TEST_SMOKE_SPARKS))
RESULTS := .test-results
since = $$(( $$(date +%s) - $(1) ))
# $(call part,<name>,<command>): runs the command, prints its time, records its status.
part = t=$$(date +%s); status=0; $(2) || status=$$?; \
	echo "== $(1): $(call since,$$t) s (ended $$(date +%T))"; echo $$status >$(RESULTS)/$(1)

test:
	@rm -rf $(RESULTS) && mkdir $(RESULTS); t=$$(date +%s); status=0; \
	$(MAKE) --no-print-directory -k -j$(TEST_JOBS) --output-sync=target \
	  SMOKE_SPARKS="$(TEST_SMOKE_SPARKS)" SMOKE_AFTER="$(VENV)/spark-classes.jsa" \
	  test-lane-main test-lane-others test-lane-install || status=1; \
	echo "== make test: $(call since,$$t) s (ended $$(date +%T))"; failed=$$(grep -Lx 0 $(RESULTS)/* | xargs -rn1 basename); \
	if [ -n "$$failed" ]; then echo "== failed:" $$failed; status=1; fi; exit $$status

test-lane-main: test-main-suite $(foreach v,$(MAIN_LANE_SMOKE),$(call smoke-venv,$(v)))
	@$(foreach v,$(MAIN_LANE_SMOKE),$(call part,smoke-$(v),$(call smoke-run,$(v)));) true

# The install tests wait on PyPI and pip's builds more than on the cores (on a fresh machine
# pip's cache is empty: 3 to 6 minutes), so they run beside the two lanes from the start.
test-lane-install: $(STAMP)
	@$(call part,install,$(MAKE) --no-print-directory test-install)

test-lane-others: test-kafka-venv-suite $(foreach v,$(OTHER_LANE_SMOKE),$(call smoke-venv,$(v)))
	@$(foreach v,$(OTHER_LANE_SMOKE),$(call part,smoke-$(v),$(call smoke-run,$(v)));)

test-main-suite: $(STAMP) $(VENV)/spark-classes.jsa
	@$(call part,main,$(MAIN_SUITE))

test-kafka-venv-suite: $(KAFKA_STAMP) jars
	@$(call part,kafka-delta-spark$(if $(filter $(KAFKA_SPARK),$(TEST_SMOKE_SPARKS)),-smoke-$(KAFKA_SPARK)),$(ON_KAFKA_VENV))

# What `make test` needs, built side by side, nothing run.
test-setup: $(STAMP) $(KAFKA_STAMP) $(SMOKE_STAMPS) jars $(VENV)/spark-classes.jsa

# A class-data sharing archive of the classes the tests' Spark loads, for the main suite's
# venv, whose session and twenty-odd drivers of its tests start with it (tests/jvm_archive.py;
# 50-75 CPU-seconds, 190 MB; each start then spends about 6 fewer): dumped by one session of the
# tests' settings, remade with its venv. A failed dump fails nothing: the tests run without it.
# None for $(KAFKA_VENV): its session alone would map one (the Kafka job's and the CLI's
# drivers have another class path), which saved 8-13 CPU-seconds where the dump cost 60-75.
$(VENV)/spark-classes.jsa: $(STAMP)
	-$(PY) tests/jvm_archive.py >$(VENV)/spark-classes.log 2>&1

# The main suite on $(TEST_WORKERS) pytest workers (pytest-xdist), each with its own Spark
# session, a file at a time (a file's tests share its fixtures), the slowest files first
# (tests/conftest.py): one worker's waits on subprocesses and timeouts leave the cores to the
# other. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
MAIN_SUITE = $(PY) -m pytest -q --durations=30 -n $(TEST_WORKERS) --dist loadfile \
	-m "not kafka and not delta_spark and not install" tests
test-main: $(STAMP)
	$(MAIN_SUITE)

# The Kafka, delta-spark and (when $(TEST_SMOKE_SPARKS) holds $(KAFKA_SPARK)) smoke tests on
# $(KAFKA_VENV) in one pytest: one Spark session (their Connect server too) for the three, as
# `make test-kafka`, `make test-delta-spark` and `make smoke` would run them one by one.
ON_KAFKA_VENV = COMPACTED_SINK_KAFKA_TESTS=required COMPACTED_SINK_DELTA_TESTS=required \
	COMPACTED_SINK_RACE_ROUNDS=$(RACE_ROUNDS) $(KAFKA_PY) -m pytest -q --durations=30 \
	-m "kafka or delta_spark$(if $(filter $(KAFKA_SPARK),$(TEST_SMOKE_SPARKS)), or smoke)" tests

# The package installed beside pyspark 3.5.9 and beside databricks-connect: throwaway venvs
# under pytest's tmp_path, set up side by side, wheels from pip's cache after the first run
# (4-5 min on a 2-core machine at load average 15-20).
test-install: $(STAMP)
	COMPACTED_SINK_INSTALL_TESTS=required $(PY) -m pytest -q --durations=5 -m install tests/install

test-kafka: $(KAFKA_STAMP) jars
	COMPACTED_SINK_KAFKA_TESTS=required $(KAFKA_PY) -m pytest -q --durations=10 -m kafka tests

# The Debezium pipeline at length (tests/kafka/test_debezium_*.py): the seeded workloads for
# CDC_SEEDS seeds (`make test` runs one) and the broker restarted while the events flow.
CDC_SEEDS ?= 5
test-cdc: $(KAFKA_STAMP) jars
	COMPACTED_SINK_KAFKA_TESTS=required COMPACTED_SINK_CDC_TESTS=required \
	  COMPACTED_SINK_CDC_SEEDS=$(CDC_SEEDS) $(KAFKA_PY) -m pytest -q --durations=10 -m kafka \
	  tests/kafka/test_debezium_*.py

# `make test` races the two engines for RACE_ROUNDS rounds; `make race` for 50 (the issue's
# count: about 1 min a round on a loaded 2-core machine).
RACE_ROUNDS ?= 4
test-delta-spark: $(KAFKA_STAMP) jars
	COMPACTED_SINK_DELTA_TESTS=required COMPACTED_SINK_RACE_ROUNDS=$(RACE_ROUNDS) \
	  $(KAFKA_PY) -m pytest -q --durations=10 -m delta_spark tests

race: $(KAFKA_STAMP) jars
	COMPACTED_SINK_DELTA_TESTS=required COMPACTED_SINK_RACE_ROUNDS=50 $(KAFKA_PY) -m pytest -q -s \
	  tests/delta_spark/test_two_engines_racing.py

# The smoke suite on each pyspark of $(SMOKE_SPARKS), one venv each with the `test` extra (4.2's
# is the Kafka venv, with the dev extras); `make test` runs it on $(TEST_SMOKE_SPARKS).
# $(call smoke-run,<version>): pyspark 3.5's wheel has no Connect server: the plugin jar first.
smoke-run = $(if $(filter 3.5.%,$(1)),$(MVN) -q -B $(DEPENDENCY_PLUGIN):get -Dtransitive=false \
	-Dartifact=org.apache.spark:spark-connect_2.12:$(CONNECT_PLUGIN_3.5) && ) \
	.venv-spark$(basename $(1))/bin/python -m pytest -q -m smoke tests/smoke
smoke: $(KAFKA_STAMP) $(SMOKE_STAMPS)
	@status=0; $(foreach v,$(SMOKE_SPARKS),echo "== pyspark $(v)"; $(call smoke-run,$(v)) || status=1;) \
	exit $$status

lint: $(STAMP)
	$(VENV)/bin/ruff check sinks checkpoints streaming tests bench
	$(VENV)/bin/ruff format --check sinks checkpoints streaming tests bench

# The sink beside the baselines users write (delta-spark MERGE INTO from foreachBatch,
# delta-rs MERGE fed from Spark, Spark's Delta append, Spark's Parquet write), in one run:
# on $(KAFKA_VENV) with delta-spark's jars from .jars (about 10 min idle, 50 on 2 shared cores);
# then the systems built for this job at steady state (`bench-peers`, below: hours). RESULTS.md
# keeps the earlier run's figures ($(BENCH_PREVIOUS)) below the new ones.
BENCH_PREVIOUS ?= results.json
bench: $(KAFKA_STAMP) $(DELTA_JARS)
	$(KAFKA_PY) -m bench.run --out bench --previous $(BENCH_PREVIOUS)
	$(MAKE) --no-print-directory bench-peers

bench-quick: $(KAFKA_STAMP) $(DELTA_JARS)
	$(KAFKA_PY) -m bench.run --quick --out bench/quick

# Not part of `make test`: one pass over never-cleaned logs of 1e6-1e7 records, the append
# against Spark's plain Parquet write, state() (bench/SCALE.md; about 40 min on 2 cores).
bench-scale: $(STAMP)
	$(PY) -m bench.scale --out bench

# Not part of `make test`: the append's two writers (Python workers, Spark's Parquet writer)
# against Spark's Parquet write of the same batch, plain and split by partition, at 50,000
# and 1e6 records of 512 B, Kafka input and assigned offsets (bench/append_writers.json;
# about 8 min on 2 idle cores).
bench-append: $(STAMP)
	$(PY) -m bench.append_writers --out bench/append_writers.json

# Not part of `make test`: a consumer's streaming bootstrap of a 1e6-record log against a
# Parquet read of the same files and Spark's own Parquet file stream (about 3 min).
bench-consumer: $(STAMP)
	$(PY) -m bench.consumer_read --out bench/consumer_read.json

# Not part of `make test`: lookups of one key and of 1,000 keys at 1e6 and 1e7 live keys,
# cleaned and with a 10 % dirty region, against read_state, DuckDB and Spark's state(), and
# the key filter's cost to the writers (bench/lookup.json; about 15 min on 2 cores).
bench-lookup: $(STAMP)
	$(PY) -m bench.lookup --out bench/lookup.json

bench-lookup-pass: $(STAMP)
	$(PY) -m bench.lookup_pass --out bench/lookup_pass.json

.PHONY: bench-erasure
bench-erasure: $(STAMP)
	$(PY) -m bench.erasure_status --large --out bench/erasure_status.json
	$(PY) -m bench.erasure_query --out bench/erasure_query.json

# Not part of `make test`: a cleaner-state transition's write to the checkpoint table, the
# sink's rewrite against a delta-rs MERGE, at 6 to 10,000 rows (bench/checkpoint_writes.json;
# about 1 min).
bench-checkpoint: $(STAMP)
	$(PY) -m bench.checkpoint_writes --out bench/checkpoint_writes.json

# Not part of `make test`: one pass on a two-worker standalone cluster on loopback, its tasks
# on both workers (bench/cluster_pass.json; about 5 min on 2 cores).
bench-cluster: $(STAMP)
	$(PY) -m bench.cluster_pass --out bench

# Not part of `make test`: the change feed at 1e6 keys x 512 B, the append, its bytes and one
# batch's feed against delta-spark's MERGE and table_changes (bench/change_feed.json; about
# 15 min on 2 shared cores), then Delta's judge over a longer workload (60 batches).
.PHONY: bench-change-feed
bench-change-feed: $(KAFKA_STAMP) $(DELTA_JARS)
	$(KAFKA_PY) -m bench.change_feed --out bench/change_feed.json
	COMPACTED_SINK_DELTA_TESTS=required COMPACTED_SINK_CDF_BATCHES=60 \
	  $(KAFKA_PY) -m pytest -q -m delta_spark tests/delta_spark/test_change_feed_judge.py

# Not part of `make test`: 3,000 micro-batches through a streaming query (20-40 min).
soak: $(STAMP)
	$(PY) -m bench.soak --out bench

soak-quick: $(STAMP)
	$(PY) -m bench.soak --batches 300 --out bench/soak-quick

# Not part of `make test`: exit codes of processes that used the sink (about 10 min).
soak-exit: $(STAMP)
	$(PY) -m bench.soak_exit --runs 100 --spark-runs 10 --user-runs 10

# Not part of `make test`: the sink on S3 behind the fault proxy, longer and harsher (20-30 min).
soak-faults: $(STAMP)
	FAULT_BATCHES=12 FAULT_RATE=0.05 $(PY) -m pytest -q -s tests/storage/test_object_store_faults.py

clean:
	rm -rf lake-demo lake-demo-kafka .pytest_cache dist

# ---- The peers: Apache Paimon, Apache Hudi merge-on-read, delta-spark MERGE with deletion vectors
# (bench/peers.py). Maven Central serves Paimon's Spark connector (paimon-spark-3.5, up to 0.9.0) and
# Hudi's Spark bundle (hudi-spark3.5-bundle_2.12, up to 1.2.0) for Spark 3.5 only, no Spark 4 build:
# every system runs on pyspark $(PEERS_SPARK) in a venv of its own (the package installed from
# the checkout), with delta-spark 3.3 for the MERGE baselines: one Spark for all. Each run below
# is a process of its own; `bench.peers --report` checks that every process's expected state
# and every system's state agree and writes PEERS.md, results.json and peers.png.
PEERS_SPARK ?= 3.5.9
PEERS_VENV ?= .venv-peers
PEERS_PY := $(PEERS_VENV)/bin/python
PEERS_STAMP := $(PEERS_VENV)/.installed
PEERS_OUT ?= bench/peers
PAIMON_JARS := $(JARS)/paimon-$(PEERS_SPARK)/.fetched
HUDI_JARS := $(JARS)/hudi-$(PEERS_SPARK)/.fetched
PEERS_DELTA_JARS := $(JARS)/delta-$(PEERS_SPARK)/.fetched

.PHONY: jars-peers bench-peers bench-peers-quick bench-replay

# Built by uv as the test venvs are: pyspark $(PEERS_SPARK)'s wheel is the one the smoke venv of
# that line built and uv's cache keeps.
$(PEERS_STAMP): pyproject.toml | $(UV)
	$(call new-venv,$(PEERS_VENV),'pyspark==$(PEERS_SPARK)' 'delta-spark==3.3.2' -e . \
	  numpy matplotlib 'pypaimon==2.1.0' 'hudi==0.5.0')
	touch $@

$(PAIMON_JARS): jvm/paimon/pom.xml
	$(call fetch-jars,jvm/paimon/pom.xml,$(@D))
	touch $@

$(HUDI_JARS): jvm/hudi/pom.xml
	$(call fetch-jars,jvm/hudi/pom.xml,$(@D))
	touch $@

$(PEERS_DELTA_JARS): jvm/delta-3.5/pom.xml
	$(call fetch-jars,jvm/delta-3.5/pom.xml,$(@D))
	touch $@

jars-peers: $(PAIMON_JARS) $(HUDI_JARS) $(PEERS_DELTA_JARS)

# Not part of `make test`: 1e6 keys x 512 B, uniform and Zipf, 40 batches of 100,000 each, every
# peer and the sink (hours on 2 cores: run it on an idle machine; bench/peers-quick/PEERS.md says
# how long from the quick run).
# The files it writes are the ones bench/peers holds: the peers, the sink and delta-rs MERGE
# (`-sink-side`), copy-on-write MERGE (`-cow`), the sink with combine.before.append on
# (`-combined`), with cleaning off (`-append-only`: its appends alone) and at
# min.cleanable.dirty.ratio 0.2 (`-dirty-020`: a cheaper state read), then where the
# sink's state read goes (state_read_profile.txt) and the report. A rerun of some systems
# (`--systems ... --tag <name>`) leaves a file of its own beside them; the report takes each
# system from its newest run.
bench-peers: $(PEERS_STAMP) jars-peers
	$(PEERS_PY) -m bench.peers --out $(PEERS_OUT)
	$(PEERS_PY) -m bench.peers --out $(PEERS_OUT) --systems compacted_sink,merge_per_batch --tag sink-side
	$(PEERS_PY) -m bench.peers --out $(PEERS_OUT) --systems delta_spark_merge --tag cow
	$(PEERS_PY) -m bench.peers --out $(PEERS_OUT) --systems compacted_sink_combined --tag combined
	$(PEERS_PY) -m bench.peers --out $(PEERS_OUT) --systems sink_cleaning_off --tag append-only
	$(PEERS_PY) -m bench.peers --out $(PEERS_OUT) --systems compacted_sink_dirty_020 --tag dirty-020
	$(PEERS_PY) -m bench.state_read_profile --out $(PEERS_OUT)
	$(PEERS_PY) -m bench.peers --report --out $(PEERS_OUT)

# The same on 1e5 keys, 6 batches of 20,000 (about 30 min on 2 loaded cores): every system runs
# and ends in the same state.
bench-peers-quick: $(PEERS_STAMP) jars-peers
	$(PEERS_PY) -m bench.peers --quick --out bench/peers-quick
	$(PEERS_PY) -m bench.peers --quick --out bench/peers-quick --systems compacted_sink,merge_per_batch,delta_spark_merge --tag sink-side
	$(PEERS_PY) -m bench.peers --report --out bench/peers-quick

# Not part of `make test`: the recovery drill (bench/replay.py): 1e6 live keys x 512 B (add
# REPLAY_ARGS=--keys=10000000 for 1e7), after a pass and with a dirty section just below the
# trigger, read_state / state() against Arrow's and Spark's scan of the same files, a Redis
# restore and a PostgreSQL 15 COPY out (about 15 min on 2 cores at 1e6). Installs redis-server
# (Debian) and the bench-only clients (redis, psycopg) when missing.
REPLAY_ARGS ?=
bench-replay: $(STAMP)
	command -v redis-server >/dev/null || (apt-get update && apt-get install -y redis-server)
	$(PY) -c "import redis, psycopg" 2>/dev/null || $(PY) -m pip install redis "psycopg[binary]"
	$(PY) -m bench.replay --out bench/replay.json $(REPLAY_ARGS)

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Spark's own Delta (delta-spark 4.4: built for Spark 4.0-4.2, none for 4.3) runs on a second
# venv at pyspark $(SPARK42), with its jars fetched once by mvn into .jars/delta-$(SPARK42)/.
SPARK42 ?= 4.2.0
SPARK42_VENV ?= .venv-spark4.2
SPARK42_PY := $(SPARK42_VENV)/bin/python
SPARK42_STAMP := $(SPARK42_VENV)/.installed
MVN ?= mvn
DEPENDENCY_PLUGIN := org.apache.maven.plugins:maven-dependency-plugin:3.8.1
DELTA_JARS := .jars/delta-$(SPARK42)/.fetched
# The pyspark releases `make smoke` checks, one venv each (.venv-spark<major.minor>).
SMOKE_SPARKS ?= 4.0.1 4.1.4 4.2.0

.PHONY: demo jars test test-delta-spark smoke lint bench bench-quick bench-scale bench-cluster soak soak-quick soak-exit soak-faults clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(SPARK42_STAMP): pyproject.toml
	python3 -m venv $(SPARK42_VENV)
	$(SPARK42_PY) -m pip install --quiet --upgrade pip
	$(SPARK42_PY) -m pip install --quiet 'pyspark==$(SPARK42)' -e '.[dev]'
	touch $@

$(DELTA_JARS): jvm/delta/pom.xml
	rm -rf $(@D) && $(MVN) -q -B -f jvm/delta/pom.xml -Dspark.version=$(SPARK42) \
		$(DEPENDENCY_PLUGIN):copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(@D)
	touch $@

jars: $(DELTA_JARS)

demo: $(STAMP)
	$(VENV)/bin/compacted-sink demo --lake lake-demo

test: $(STAMP) $(SPARK42_STAMP) jars
	@status=0; \
	$(PY) -m pytest -q --durations=15 -m "not delta_spark" tests || status=1; \
	$(MAKE) --no-print-directory test-delta-spark || status=1; \
	exit $$status

test-delta-spark: $(SPARK42_STAMP) jars
	COMPACTED_SINK_DELTA_TESTS=required $(SPARK42_PY) -m pytest -q --durations=10 -m delta_spark tests

# Not part of `make test`: the smoke suite on each pyspark of $(SMOKE_SPARKS), one venv each.
smoke:
	@status=0; for v in $(SMOKE_SPARKS); do \
	  venv=.venv-spark$${v%.*}; \
	  if [ ! -f $$venv/.installed ]; then \
	    python3 -m venv $$venv && $$venv/bin/python -m pip install --quiet --upgrade pip && \
	    $$venv/bin/python -m pip install --quiet "pyspark==$$v" -e '.[dev]' && touch $$venv/.installed; \
	  fi; \
	  echo "== pyspark $$v"; $$venv/bin/python -m pytest -q -m smoke tests/smoke || status=1; \
	done; exit $$status

lint: $(STAMP)
	$(VENV)/bin/ruff check sinks checkpoints streaming tests bench
	$(VENV)/bin/ruff format --check sinks checkpoints streaming tests bench

bench: $(STAMP)
	$(PY) -m bench.run --out bench

bench-quick: $(STAMP)
	$(PY) -m bench.run --quick --out bench/quick

# Not part of `make test`: one pass over never-cleaned logs of 1e6-1e7 records, the append
# against Spark's plain Parquet write, state() (bench/SCALE.md; about 40 min on 2 cores).
bench-scale: $(STAMP)
	$(PY) -m bench.scale --out bench

# Not part of `make test`: one pass on a two-worker standalone cluster on loopback, its tasks
# on both workers (bench/cluster_pass.json; about 5 min on 2 cores).
bench-cluster: $(STAMP)
	$(PY) -m bench.cluster_pass --out bench

# Not part of `make test`: 3,000 micro-batches through a streaming query (20-40 min).
soak: $(STAMP)
	$(PY) -m bench.soak --out bench

soak-quick: $(STAMP)
	$(PY) -m bench.soak --batches 300 --out bench/soak-quick

# Not part of `make test`: exit codes of processes that used the sink (about 10 min).
soak-exit: $(STAMP)
	$(PY) -m bench.soak_exit --runs 100 --spark-runs 10

# Not part of `make test`: the sink on S3 behind the fault proxy, longer and harsher (20-30 min).
soak-faults: $(STAMP)
	FAULT_BATCHES=12 FAULT_RATE=0.05 $(PY) -m pytest -q -s tests/storage/test_object_store_faults.py

clean:
	rm -rf lake-demo .pytest_cache

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench bench-quick bench-scale bench-cluster soak soak-quick soak-exit soak-faults clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/compacted-sink demo --lake lake-demo

test: $(STAMP)
	$(PY) -m pytest -q --durations=15 tests

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

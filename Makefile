VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench bench-quick bench-scale soak soak-quick clean

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

# Not part of `make test`: 3,000 micro-batches through a streaming query (20-40 min).
soak: $(STAMP)
	$(PY) -m bench.soak --out bench

soak-quick: $(STAMP)
	$(PY) -m bench.soak --batches 300 --out bench/soak-quick

clean:
	rm -rf lake-demo .pytest_cache

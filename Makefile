# Two commands do all the set-up (README): `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CORES  ?= 2
# test processes (0: the tests run in pytest's own process): one process keeps under one core busy
# (single-threaded Python, start-ups, Flower heartbeats, SLURM polls), so a second uses the other;
# each test file stays on one process, so its module fixtures are built once (benchmarks §8); files go to the
# processes in the collection's order, the longest first (tests/conftest.py: LONG_FILES), not by test count
TEST_WORKERS ?= 2
PIP    := $(BIN)/python -m pip
# a config of your own for demo and report: `make demo CONFIG=mine.yaml`, `make report CONFIG=mine.yaml`
# (the report reads the outputs of the config it is given: the one the workflow ran with; default: the demo)
CONFIG ?=
CONFIG_ARG := $(if $(CONFIG),--configfile $(CONFIG))

.PHONY: demo test test-latest venv-latest check bench bench-gpu lint report track venv system-deps freeze clean-results

venv: $(STAMP)

$(STAMP): envs/requirements.txt envs/constraints.txt pyproject.toml
	@$(MAKE) --no-print-directory system-deps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip wheel
	$(PIP) install -r envs/requirements.txt -c envs/constraints.txt
	# ultralytics pulls opencv-python next to the headless build: keep only the headless one
	$(PIP) uninstall -y -q opencv-python
	$(PIP) install -q --force-reinstall --no-deps -c envs/constraints.txt opencv-python-headless
	$(PIP) install -q --no-deps -e .
	touch $(STAMP)

# medmnistc needs ImageMagick's MagickWand shared library; the report test renders the HTML report
# in headless Chromium (Debian/Ubuntu packages below, installed when run as root).
system-deps:
	@if ldconfig -p 2>/dev/null | grep -q libMagickWand; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing libmagickwand-6.q16-6 (MagickWand, needed by medmnistc)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libmagickwand-6.q16-6 >/dev/null; \
	else \
		echo "WARNING: ImageMagick MagickWand not found; medmnistc corruptions will fail."; \
		echo "         Install it (Debian/Ubuntu: sudo apt-get install libmagickwand-6.q16-6; conda: imagemagick)."; \
	fi
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing chromium (headless, for the HTML report test)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
			|| echo "WARNING: could not install chromium; tests/test_report_html.py will skip its rendering test."; \
	else \
		echo "WARNING: headless Chromium not found; tests/test_report_html.py will skip its rendering test."; \
		echo "         Install it (Debian: sudo apt-get install chromium; Ubuntu: chromium-browser)."; \
	fi

demo: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) $(CONFIG_ARG)
	$(BIN)/snakemake --cores 1 --report results/report.html $(CONFIG_ARG)
	@echo "demo done: tables in results/*/tables, figures in results/*/figures, report in results/report.html"

report: $(STAMP)
	$(BIN)/snakemake --cores 1 --report results/report.html $(CONFIG_ARG)

# finished runs logged into TensorBoard and MLflow (results/mlflow.db) from their files, no training:
# `make track RUNS=results/mine` (a run folder or any folder above runs; docs/running.md, "Tracking")
RUNS ?= results
track: $(STAMP)
	$(BIN)/python -m fedmedbench.fl.tracking backfill $(RUNS)

test: $(STAMP)
	$(BIN)/python -m pytest -q tests -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The suite against the newest releases of the stack: each direct dependency (envs/requirements.txt) at its newest
# release but KEEP_PINS (torch's wheel is machine-specific; `make test-latest KEEP_PINS=` takes its newest too),
# the rest as new as they fit, in its own venv (envs/newest.py; `make freeze` there would re-pin).
LATEST    := .venv-latest
KEEP_PINS ?= torch torchvision
venv-latest:
	@$(MAKE) --no-print-directory system-deps
	test -x $(LATEST)/bin/python || $(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install -q --upgrade pip wheel
	$(LATEST)/bin/python envs/newest.py --keep $(KEEP_PINS) < envs/requirements.txt > $(LATEST)/requirements-latest.txt
	$(LATEST)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -r $(LATEST)/requirements-latest.txt
	$(LATEST)/bin/python -m pip uninstall -y -q opencv-python
	$(LATEST)/bin/python -m pip install -q --force-reinstall --no-deps --upgrade opencv-python-headless
	$(LATEST)/bin/python -m pip install -q --no-deps -e .
	$(LATEST)/bin/python -m pip freeze --exclude-editable | grep -iE '^(snakemake|flwr|torch|mlflow-skinny|ultralytics)=='

test-latest: venv-latest
	$(LATEST)/bin/python -m pytest -q tests -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# outputs of the config (CONFIG=file, else config/config.yaml) that are missing, by folder: `snakemake -n` does
# not rerun a finished job whose outputs (a run's model.pt, or its whole folder) were deleted
check: $(STAMP)
	$(BIN)/python -m fedmedbench.workflow.check_outputs $(if $(CONFIG),--configfile $(CONFIG))

# CPU benchmarks (docs/benchmarks.md); results appended to bench/results.jsonl
BENCH_OUT := bench/results.jsonl
bench: $(STAMP)
	$(BIN)/python bench/planning.py --out $(BENCH_OUT)
	$(BIN)/python bench/data_speed.py --out $(BENCH_OUT)
	$(BIN)/python bench/engine_overhead.py --model cnn_small --rounds 5 --out $(BENCH_OUT)
	$(BIN)/python bench/engine_overhead.py --model timm:convnextv2_atto --rounds 2 --out $(BENCH_OUT)
	$(BIN)/python bench/memory.py --methods fedavg --clients 10 --rounds 1 --out $(BENCH_OUT)
	$(BIN)/python bench/memory.py --methods fedavg scaffold feddyn --clients 100 --rounds 1 --out $(BENCH_OUT)
	$(BIN)/python bench/checkpoint_growth.py --at 1 100 250 500 --out $(BENCH_OUT)
	$(BIN)/python bench/host_overhead.py --rounds 6 --repeats 2 --out $(BENCH_OUT)
	$(BIN)/python bench/state_write_gil.py --writes 10 --out $(BENCH_OUT)
	$(BIN)/python bench/seeds_side_by_side.py --seeds 3 --rounds 3 --out $(BENCH_OUT)
	@if [ -d benchmarks ]; then $(BIN)/python bench/demo_breakdown.py --out $(BENCH_OUT); fi

# every GPU measurement of docs/benchmarks.md §6 (a CUDA build of torch and a GPU needed)
bench-gpu: $(STAMP)
	PYTHON=$(BIN)/python bash bench/gpu_session.sh bench/gpu_results.jsonl

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/snakemake --lint

freeze: $(STAMP)
	$(PIP) freeze --exclude-editable | grep -v '^opencv-python=' | sed 's/+cpu//' > envs/constraints.new && mv envs/constraints.new envs/constraints.txt

clean-results:
	rm -rf results logs benchmarks resources .snakemake

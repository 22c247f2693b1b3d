# sarc's environments, tests and the default job.
#   make run    set up .venv, compile models/gcn.py and train it on the embedded Cora
#   make test   set up both environments and run the suite in each
#   make bench  run the benchmarks that fit this machine (~30-40 min on 2 cores) and write
#               docs/benchmarks.md; make bench-quick: tiny sizes, out/bench-quick/benchmarks.md
# Environments are reused: they are rebuilt only when their requirements change.

PYTHON ?= python3
VENV := .venv
VENV_DGL := .venv-dgl

.PHONY: run test test-main test-dgl envs clean-envs bench bench-quick

$(VENV)/.stamp: requirements/main.txt pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q -r requirements/main.txt
	$(VENV)/bin/python -m pip install -q --no-deps -e .
	touch $@

$(VENV_DGL)/.stamp: requirements/dgl.txt pyproject.toml
	test -x $(VENV_DGL)/bin/python || $(PYTHON) -m venv $(VENV_DGL)
	$(VENV_DGL)/bin/python -m pip install -q -r requirements/dgl.txt
	$(VENV_DGL)/bin/python -m pip install -q --no-deps -e .
	touch $@

envs: $(VENV)/.stamp $(VENV_DGL)/.stamp

run: $(VENV)/.stamp
	$(VENV)/bin/sarc compile models/gcn.py --emit ir,plan,kernels,schedule --out out/gcn --overwrite
	$(VENV)/bin/sarc train models/gcn.py --dataset cora --log-every 20

# The suite runs a test file per worker process (pytest-xdist), one worker per core, at most 4,
# and names its 40 slowest tests (the suite must stay within CI's time). sarc's modules are
# compiled first: each of the suite's hundreds of worker processes would compile them again.
PYTEST := -m pytest -q tests -n auto --maxprocesses 4 --dist loadfile --durations=40

test-main: $(VENV)/.stamp
	$(VENV)/bin/python -m compileall -q sarc
	$(VENV)/bin/python $(PYTEST)

# In the DGL environment DGL must import: SARC_REQUIRE_DGL turns a skip into a failure. It
# runs every test but the DGL-free end-to-end runs (marker `once`), which the main
# environment runs: the unit, differential and DGL tests on torch 2.2.1, DGL's end to end.
test-dgl: $(VENV_DGL)/.stamp
	$(VENV_DGL)/bin/python -m compileall -q sarc
	SARC_REQUIRE_DGL=1 $(VENV_DGL)/bin/python $(PYTEST) -m "not once"

test: test-main test-dgl

# The DGL environment's steps run where it exists (make envs) and are skipped otherwise.
bench: $(VENV)/.stamp
	$(VENV)/bin/python benchmarks/report.py --dgl-python $(VENV_DGL)/bin/python

bench-quick: $(VENV)/.stamp
	$(VENV)/bin/python benchmarks/report.py --quick --dgl-python $(VENV_DGL)/bin/python

clean-envs:
	rm -rf $(VENV) $(VENV_DGL)

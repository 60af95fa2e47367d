# The two commands a user needs: `make demo` and `make test`. Both install first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install test demo benchmark clean

install: $(STAMP)

# The stamp depends on the pin files, so a changed pin reinstalls and a second run is a no-op.
$(STAMP): requirements.txt requirements-fairseq.txt setup.py fairseq_posenc/csrc/floater_rk4.cpp
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-fairseq.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	# FLOATER's C++ step loops, next to the sources (about 30 s; skipped with a message where no
	# C++ compiler is found, and FLOATER then runs its Python loops)
	$(PY) setup.py --quiet build_ext --inplace
	$(PY) -c "import fairseq, fairseq_posenc, torch; print('installed fairseq', fairseq.__version__, 'torch', torch.__version__)"
	touch $@

test: install
	$(VENV)/bin/pytest $(PYTEST_ARGS)

demo: install
	$(PY) scripts/demo.py $(DEMO_ARGS)

benchmark: install
	$(PY) scripts/benchmark.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info fairseq_posenc/_floater_rk4.*.so

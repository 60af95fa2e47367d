# The two commands a user needs: `make demo` and `make test`. Both install first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install test test-fast test-numerics demo benchmark clean

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

# Two pytest workers (pytest-xdist), one file per worker at a time so that a file's fixtures are
# built once, each worker on one torch thread unless OMP_NUM_THREADS says otherwise: most of the
# suite is fairseq-train and fairseq-generate processes, whose start-up (imports, one core)
# leaves the second core idle in a serial run. TEST_WORKERS=0 runs serially in one process.
TEST_WORKERS ?= 2

test: install
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(VENV)/bin/pytest \
		$(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

# The inner loop (a few minutes on two cores): the plugin's unit tests (tests/unit, less the ones
# marked slow) and one fairseq-train run (marked fast_run); tests/conftest.py marks every test
# outside tests/unit slow. `make test` (and CI) still runs everything.
test-fast: install
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(VENV)/bin/pytest -m "not slow" \
		$(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

# The float comparisons (tests marked numerics) under each vector kernel set torch can pick on
# this CPU (default always; avx2 and avx512 where /proc/cpuinfo lists them: ATen's avx512 kernels
# need avx512f, bw, dq and vl) and with 1 and 2 threads, each combination in turn, then the
# comparisons closest to their tolerances. A tolerance that holds for one summation order only
# fails here, not on the next machine. NUMERICS_LOG=file appends every comparison's difference
# and tolerance to file and keeps it (json lines; `python tests/helpers/tolerances.py file` summarises).
NUMERICS_FLAGS := $(shell cat /proc/cpuinfo 2>/dev/null | grep -m1 '^flags')
NUMERICS_CAPABILITIES := default \
	$(if $(filter avx2,$(NUMERICS_FLAGS)),avx2) \
	$(if $(filter-out 4,$(words $(filter avx512f avx512bw avx512dq avx512vl,$(NUMERICS_FLAGS)))),,avx512)
NUMERICS_THREADS := 1 2

test-numerics: install
	@log=$${NUMERICS_LOG:-$$(mktemp)}; status=0; \
	for capability in $(NUMERICS_CAPABILITIES); do for threads in $(NUMERICS_THREADS); do \
		echo "== ATEN_CPU_CAPABILITY=$$capability OMP_NUM_THREADS=$$threads"; \
		ATEN_CPU_CAPABILITY=$$capability $(PY) -c "import torch; print('   torch picks', torch.backends.cpu.get_cpu_capability())"; \
		NUMERICS_LOG=$$log ATEN_CPU_CAPABILITY=$$capability OMP_NUM_THREADS=$$threads \
			$(VENV)/bin/pytest -m numerics -q -p no:cacheprovider $(PYTEST_ARGS) \
			|| { status=1; echo "== FAILED: ATEN_CPU_CAPABILITY=$$capability OMP_NUM_THREADS=$$threads"; }; \
	done; done; \
	echo "== the 20 comparisons closest to their tolerances, over all combinations"; \
	$(PY) tests/helpers/tolerances.py $$log 20; [ -n "$$NUMERICS_LOG" ] || rm -f $$log; exit $$status

demo: install
	$(PY) scripts/demo.py $(DEMO_ARGS)

benchmark: install
	$(PY) scripts/benchmark.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info fairseq_posenc/_floater_rk4.*.so

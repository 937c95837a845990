# Quick start: `make demo` (train + evaluate the CPU demos) and `make test` (test suite).
# Both first create/complete the virtual environment at .venv (tools/setup_env.sh); a
# finished environment is recognised by its stamp and never rebuilt.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: env test demo smoke-demo clean-demo

env:
	@bash tools/setup_env.sh

test: env
	$(PY) -m pytest tests $(PYTEST_ARGS)

demo: env
	$(PY) tools/run_demo.py

smoke-demo: env
	$(PY) tools/smoke_demo.py

clean-demo:
	rm -rf work_dirs/demo

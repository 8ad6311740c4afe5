# Two commands (see README.md):
#   make course   set everything up, open the course in JupyterLab
#   make test     set everything up, run every test (pytest + nbval + exercises in sync)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned here: on the course machines this is a CPU build lying on local disk; on a
# Linux GPU machine pip takes PyPI's CUDA build of the same version.
TORCH ?= torch==2.13.0
PYTEST_WORKERS ?= 2

.PHONY: install course test test-fast notebooks exercises bench-quick clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet pip
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (llminfra)" >/dev/null
	touch $@

install: $(BIN)/.installed

# as root (containers), JupyterLab refuses to start without --allow-root
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)

course: install
	$(BIN)/jupyter lab $(LAB_ARGS) notebooks/00_start_here.ipynb

test: install
	$(BIN)/python -m llminfra.course.exercises --check
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile \
		--nbval --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 300 \
		tests notebooks solutions

test-fast: install
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile tests

# maintainers: re-run the notebooks and store their outputs, then regenerate exercises/
notebooks: install
	$(BIN)/python -m llminfra.course.execute notebooks/*.ipynb solutions/*.ipynb
	$(BIN)/python -m llminfra.course.exercises

exercises: install
	$(BIN)/python -m llminfra.course.exercises

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# Set-up and everyday commands. Each target installs what is missing first.
#
#   make test    install, then run every test (notebooks included, via nbval)
#   make serve   install, then launch the OpenAI-compatible server on gpt2 (downloaded once if online)
#
# The virtual environment sees the system's site-packages, so a torch that is
# already installed (a CUDA build on a GPU machine) is kept; only when none is
# importable is the pinned CPU wheel installed, before the project, so that
# nothing pulls several GB of CUDA packages onto a CPU machine.

PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.roseinfer-installed
SERVE_ARGS ?=

.PHONY: install test notebooks lint serve clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

# Notebooks run under nbval and write their results to a temporary directory,
# so a test run never overwrites the committed results/.
test: install
	ROSEINFER_CPU_DTYPE=float32 ROSEINFER_RESULTS_DIR=$$(mktemp -d) $(PY) -m pytest tests notebooks --nbval

# Re-execute every notebook in place (outputs and results/ refreshed).
notebooks: install
	for nb in notebooks/*.ipynb; do \
		$(PY) -m jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=1800 "$$nb" || exit 1; \
	done
	$(PY) benchmarks/update_readme.py

lint: install
	$(PY) -m ruff check .

serve: install
	$(PY) -m roseinfer.server $(SERVE_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

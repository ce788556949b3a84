# Two commands on a fresh machine:  `make study`  (the study on the embedded default)
#                                   `make test`   (the tests, including one end-to-end study run)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
BYTECODE := $(VENV)/.bytecode
PARAMS ?= params/default.yaml
# Where pip finds torch's CPU build (torch==2.13.0 / 2.13.0+cpu). Empty: pip's own configuration
# (on the project's machines the wheel lies on disk and pip's find-links names it). Elsewhere:
# `make test TORCH_INDEX=https://download.pytorch.org/whl/cpu` (the PyTorch CPU wheel index).
TORCH_INDEX ?=
PIP_TORCH := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
# SGLang 0.5.23 for the CPU engine of stages 04-07 (make study) and the real_sglang tests.
SGL_VENV  := .venv-sglang
SGL_REQ   := tests/real_sglang/requirements.txt
SGL_STAMP := $(SGL_VENV)/.installed-$(shell cat $(SGL_REQ) | cksum | cut -d' ' -f1)

.PHONY: setup sglang-env envs prefetch study test simulate lint notebooks bench mutation jupyter clean-outputs workstation-envs gpu-clamp-check

setup: $(STAMP) $(BYTECODE)

# System packages (bubblewrap sandboxes generated code; headless Chromium renders report.html
# in the tests), then the venv with the project.
$(STAMP): pyproject.toml
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && (apt-get update -qq && apt-get install -y -qq bubblewrap) || echo "warning: bubblewrap missing: stage 05 will stop (the sandbox fails closed; apt-get install bubblewrap)"; }
	@{ command -v chromium >/dev/null && command -v chromedriver >/dev/null; } || { [ "$$(id -u)" = 0 ] && (apt-get update -qq && apt-get install -y -qq chromium chromium-driver) || echo "warning: chromium/chromedriver missing; the report's browser test will fail (apt-get install chromium chromium-driver)"; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile $(PIP_TORCH) -e '.[dev]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (nvfp4study)" >/dev/null
	rm -f $(VENV)/.installed-* && touch $@

# Both venvs install with --no-compile: pip byte-compiles every file it installs, about half of
# each install's time here, while a run imports about a quarter of them. What a run imports is
# then compiled once by importing it (lib/nvfp4study/core/bytecode.py says how it was measured);
# a failure there is only a warning (those modules compile at their first import).
$(BYTECODE): $(STAMP)
	@$(BIN)/python -m nvfp4study.core.bytecode || echo "warning: the study venv is compiled at first import instead"
	@touch $@

# Pinned, --no-deps (the file is the whole closure); rebuilt only when the file changes.
sglang-env: $(SGL_STAMP)

$(SGL_STAMP): $(SGL_REQ)
	test -x $(SGL_VENV)/bin/python || $(PYTHON) -m venv $(SGL_VENV)
	$(SGL_VENV)/bin/python -m pip install -q --no-compile --no-deps $(PIP_TORCH) -r $(SGL_REQ)
	@PYTHONPATH=lib $(SGL_VENV)/bin/python -m nvfp4study.serving.cpu_engine.warm || echo "warning: the SGLang venv is compiled at its first launch instead"
	rm -f $(SGL_VENV)/.installed-* && touch $@

# The two environments are built side by side (-j2: each pip run is mostly one core's unpacking
# and byte-compiling; on 2 cores that takes the set-up of a fresh machine from about 200 s to
# the longer of the two). ENVS_JOBS=1 builds them one after the other.
ENVS_JOBS ?= 2
envs:
	@$(MAKE) --no-print-directory -j$(ENVS_JOBS) $(STAMP) $(SGL_STAMP) prefetch $(BYTECODE)

# The SGLang releases stage 03 audits (params' sglang.audit_versions), downloaded and unpacked into
# the study cache once the study's venv is there, while the SGLang environment still builds (a fresh
# machine's stage 03 otherwise fetched them one after the other). Nothing to do when cached; a
# failure is only a warning here (stage 03 then names it).
prefetch: $(STAMP)
	@$(BIN)/python -m nvfp4study.sglang.releases --prefetch $(PARAMS) || echo "warning: SGLang releases not prefetched; stage 03 will download them"

study: envs
	$(BIN)/nvfp4study run --params $(PARAMS)

# Two workers (pytest-xdist), one test file per worker at a time (a file's module fixtures are built
# once), in the order tests/conftest.py gives, longest first (without --no-loadscope-reorder xdist
# sorts the files by their number of tests). PYTEST_ARGS= for one serial process.
PYTEST_ARGS ?= -n 2 --dist loadfile --no-loadscope-reorder
test: envs
	$(BIN)/ruff check lib tests benchmarks
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The simulated first runs (tests/simulate/first_runs.py, not part of `make test`): `nvfp4study run
# --params params/ling3-flash.yaml`, 00 to 99, on each machine class (GB10, B200 by the Docker route,
# RTX PRO 6000, H200) against stand-ins for nvidia-smi, nvcc, the Docker CLI, SGLang's GPU server and
# the Hub; each run is marked simulated wherever its results show. Two classes at a time.
simulate: $(STAMP) prefetch
	$(BIN)/python -m pytest -q -n 2 tests/simulate/first_runs.py

lint: $(STAMP)
	$(BIN)/ruff check lib tests benchmarks

# Regenerate the stored notebooks (no outputs) from their py:percent sources.
notebooks: $(STAMP)
	$(BIN)/jupytext --update --to ipynb notebooks/[0-9][0-9]_*.py

# The quantizer and SGLang environments of a GPU run (pins in envs/), and params/local.yaml naming
# them (merged over any params file). QUANTIZE_VENV / SGLANG_VENV choose the folders, ENVS_ARGS adds
# options (--card-quantizer for the card's llmcompressor 0.12.0.1, --dry-run to print only).
QUANTIZE_VENV ?= $(HOME)/.venvs/nvfp4study-quantize
SGLANG_VENV   ?= $(HOME)/.venvs/nvfp4study-sglang
workstation-envs: $(STAMP)
	$(BIN)/python -m nvfp4study.workstation.envs --quantize-venv $(QUANTIZE_VENV) --sglang-venv $(SGLANG_VENV) $(ENVS_ARGS)

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# The mutation benchmark (not part of `make test`): mutmut over the modules whose mistakes change a
# verdict or a user's safety, each with its own tests; writes benchmarks/mutation/REPORT.md.
# MUTATION_ARGS="--only roundtrip r06_mtp" runs some modules (the others kept from the last run).
mutation: $(STAMP)
	$(BIN)/python benchmarks/mutation/run.py $(MUTATION_ARGS)

# JupyterLab on the study's venv, in notebooks/. Local by default; on a remote workstation
# `make jupyter JUPYTER_IP=0.0.0.0` (or keep 127.0.0.1 and tunnel: see the README). Jupyter prints
# the URL with its token. As root (containers, cloud machines) --allow-root is added.
JUPYTER_IP   ?= 127.0.0.1
JUPYTER_PORT ?= 8888
jupyter: $(STAMP)
	cd notebooks && ../$(BIN)/jupyter lab --no-browser --ip=$(JUPYTER_IP) --port=$(JUPYTER_PORT) \
		$$([ "$$(id -u)" = 0 ] && echo --allow-root)

clean-outputs:
	find outputs -mindepth 1 -maxdepth 1 ! -name .gitkeep -exec rm -rf {} +

# On a machine with a CUDA GPU (SM90 for the FlashInfer part), nvcc >= 12.8, ninja, torch and triton
# in $(PYTHON): builds FlashInfer 0.7.2's BF16 SM90 fused-MoE subset and measures the SwiGLU clamp
# forms (gpu/clamp_kernels/README.md). CLAMP_WHEELS=<folder> takes the wheels from there (offline).
gpu-clamp-check:
	PYTHON=$(PYTHON) bash gpu/clamp_kernels/run.sh

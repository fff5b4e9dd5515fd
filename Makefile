# torch-template: `make help` lists the targets.
# Extra pytest arguments pass through ARGS, e.g. make test ARGS="-k hooks"

VENV ?= .venv
PYTHON := $(VENV)/bin/python
# The torch build of this repository's own environment, installed before anything else so
# that nothing pulls a different one. The default is the CPU build our CI machines keep on
# local disk; elsewhere pick yours, e.g. TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0
DEMO_DIR ?= build/demo
DEMO_PROJECT := $(DEMO_DIR)/digits-classifier
STAMP := $(VENV)/.installed
ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help venv test lint demo clean

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-6s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

venv: $(STAMP) ## Create .venv: torch first (TORCH=..., default torch==2.13.0), then the dev tools

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet $(TORCH)
	$(PYTHON) -m pip install --quiet --group dev
	touch $(STAMP)

# One test process per core (pytest-xdist), each test file in one process (--dist loadfile: the
# SLURM tests share one cluster, started once per file), the whole-bake files first (tests/conftest.py).
test: $(STAMP) ## Run the template's tests: bakes, hooks, and the baked projects' own tests
	$(PYTHON) -m pytest -n auto --dist loadfile --no-loadscope-reorder $(ARGS)

lint: $(STAMP) ## ruff on the hooks and tests (bakes are linted by the tests)
	$(PYTHON) -m ruff check hooks tests local_extensions.py
	$(PYTHON) -m ruff format --check hooks tests local_extensions.py
	@# A literal '}}' in a template file stays in the bake, where the bake tests refuse it (20 minutes later)
	@! grep -rnP -I '^(?!.*\{\{).*\}\}' '{{cookiecutter.__project_dir}}' \
		|| { echo "lint: a '}}' outside Jinja in the template (above): split the expression"; exit 1; }

demo: $(STAMP) ## Bake with default answers, install the bake, train on digits, print the test metrics
	rm -rf $(DEMO_DIR)
	$(PYTHON) -m cookiecutter --no-input --output-dir $(DEMO_DIR) .
	@# The bake installs with uv (the template's own, a dev dependency) and the TORCH given here, else
	@# this environment's build: its wheel where pip finds it on local disk, else torch==<version> (.ci/torch_spec).
	$(MAKE) -C $(DEMO_PROJECT) install UV="$(abspath $(VENV))/bin/uv" \
		TORCH="$(if $(filter command line,$(origin TORCH)),$(TORCH),$$(.ci/torch_spec))"
	$(MAKE) -C $(DEMO_PROJECT) train
	@echo "Test metrics of the best checkpoint:"
	@cat $$(find $(DEMO_PROJECT)/logs -name test_metrics.json)

clean: ## Remove the demo bake and caches (keeps .venv)
	rm -rf build .pytest_cache .ruff_cache

# The course's commands. The README's two: `make book` and `make test`.
#
#   make book     set up .venv and build the static book into _build/html (-W: warnings fail it)
#   make test     set up .venv (plus PyTorch and a headless Chromium) and run every test:
#                 the gpuprof unit tests, the book build, a browser check of the built book,
#                 and every notebook under nbval (lax on a CPU-only machine, strict with the
#                 sanitize file where a GPU is present)
#   make capture  on a GPU machine: execute every notebook in place and regenerate artifacts/
#   make clean    remove build output (never artifacts/ or captures/)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BOOK_FLAGS := --warningiserror --nitpick --keep-going --all
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(HAS_GPU),yes)
NBVAL_FLAGS := --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg
else
NBVAL_FLAGS := --nbval-lax
endif

.PHONY: setup book test capture browser clean

$(VENV)/.requirements: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

$(VENV)/.torch: $(VENV)/.requirements requirements-torch.txt
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --disable-pip-version-check -r requirements-torch.txt
	touch $@

setup: $(VENV)/.requirements $(VENV)/.torch

book: $(VENV)/.requirements
	$(VENV)/bin/jupyter-book build $(BOOK_FLAGS) .
	@echo "book: open _build/html/index.html"

browser:
	@bash scripts/ensure_chromium.sh

test: setup book browser
	KINETO_LOG_LEVEL=6 $(PY) -m pytest tests notebooks --nbval-current-env $(NBVAL_FLAGS)

capture: setup
	$(PY) scripts/capture_all.py

clean:
	rm -rf _build

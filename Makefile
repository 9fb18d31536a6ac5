# The course's commands. The README's two: `make book` and `make test`.
#
#   make book        set up .venv and build the static book into _build/html (-W: warnings fail it).
#                    Installs into .venv only what the build needs: the pinned requirements-book.txt.
#                    Rebuilds only what changed, and everything when a notebook or the configuration changed.
#   make test        set up .venv (requirements.txt, plus PyTorch from requirements-torch.txt unless a
#                    torch is already there), install Debian's chromium with apt-get if no Chromium is
#                    found (needs root; set CHROMIUM=/path/to/chrome to use your own), build the book,
#                    and run every test: the gpuprof unit tests, the example scripts, a browser check of
#                    the built book, and every notebook under nbval (lax on a CPU-only machine, strict
#                    with the sanitize file where a GPU is present)
#   make capture     on a GPU machine: execute every notebook in place and regenerate artifacts/
#   make nbval-gpu   on a GPU machine: strict nbval over the committed notebooks, no re-capture
#                    (PART=1 to 9 runs one part, each within ten minutes: scripts/gpu_nbval.py --help)
#   make clean       remove build output (never artifacts/ or captures/)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTHON_FLOOR := 3.11
BOOK_FLAGS := --warningiserror --nitpick --keep-going
BOOK_STAMP := _build/.book-stamp
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
# On a GPU the suite runs in one process: strict nbval re-measures on the GPU, and two
# notebooks timing kernels side by side would disturb each other's numbers. Without one, the
# test files run in parallel (pytest-xdist, each file whole on one worker: files share module
# fixtures and fork servers), on at most 4 workers (each loads PyTorch and starts programs of its own).
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
ifeq ($(HAS_GPU),yes)
NBVAL_FLAGS := --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg
else
NBVAL_FLAGS := --nbval-lax -n $(TEST_WORKERS) --dist loadfile
endif
# What the book is built from. Sphinx tracks the prose pages and included files itself; a
# changed notebook or configuration can change values glued into other pages, so those
# rebuild everything.
BOOK_SOURCES := $(wildcard book/*.md book/_ext/*.py book/_static/*) $(wildcard notebooks/*.ipynb) _config.yml _toc.yml
FULL_REBUILD := notebooks/% _config.yml _toc.yml $(VENV)/.book book/_static/% book/_ext/%

.PHONY: setup book test capture nbval-gpu browser clean python-version

python-version:
	@$(PYTHON) -c "import sys; f = tuple(map(int, '$(PYTHON_FLOOR)'.split('.'))); sys.exit(0 if sys.version_info[:2] >= f else 1)" \
	  || { echo "This course needs Python $(PYTHON_FLOOR) or newer (its pinned numpy, pandas and matplotlib do); $(PYTHON) is $$($(PYTHON) -c 'import platform; print(platform.python_version())'). Run make with PYTHON=python3.11 (or newer)." >&2; exit 2; }

$(VENV)/.book: requirements-book.txt | python-version
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-book.txt
	touch $@

$(VENV)/.requirements: $(VENV)/.book requirements.txt requirements-hta.txt pyproject.toml
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-hta.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

$(VENV)/.torch: $(VENV)/.requirements requirements-torch.txt
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --disable-pip-version-check -r requirements-torch.txt
	touch $@

setup: $(VENV)/.requirements $(VENV)/.torch

$(BOOK_STAMP): $(VENV)/.book $(BOOK_SOURCES)
	$(VENV)/bin/jupyter-book build $(BOOK_FLAGS) $(if $(filter $(FULL_REBUILD),$?),--all,) .
	@mkdir -p $(dir $@) && touch $@

book: $(BOOK_STAMP)
	@echo "book: open _build/html/index.html"

browser:
	@bash scripts/ensure_chromium.sh

test: setup book browser
	KINETO_LOG_LEVEL=6 $(PY) -m pytest tests notebooks --nbval-current-env $(NBVAL_FLAGS)

capture: setup
	$(PY) scripts/capture_all.py

nbval-gpu: setup
	$(PY) scripts/gpu_nbval.py $(if $(PART),--part $(PART),)

clean:
	rm -rf _build

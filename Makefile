# Two commands: `make demo` and `make test`. Each creates .venv when missing and installs the
# project with its pinned dependencies first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tftrain train --config=digits --model_dir=runs/demo --overwrite
	$(BIN)/tftrain prune --model_dir=runs/demo
	$(BIN)/tftrain quantize --model_dir=runs/demo --mode=int8,float16

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf runs data build *.egg-info

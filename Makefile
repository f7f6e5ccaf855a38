# Two commands: `make demo` and `make test`. Each creates .venv when missing and installs the
# project with its pinned dependencies first. `make mutation` (not part of `make test`): mutation
# testing of the pure, central modules against their unit tests (docs/mutation.md).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test mutation install clean

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

# One mutant at a time (--max-children=1): the machines are shared. Leaves mutants/ for
# `$(BIN)/mutmut show NAME` and `$(BIN)/mutmut browse`; `python bench/mutation.py --report`
# prints the table again.
mutation: $(STAMP)
	$(BIN)/python bench/mutation.py --max-children=1

clean:
	rm -rf runs data build mutants *.egg-info

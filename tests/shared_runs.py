"""Runs that several test files ask questions of: each trained once per `make test`.

A test module imports the fixture it asks questions of (`from tests.shared_runs import
text_lm_run`). pytest-xdist (`--dist loadfile`) may put those modules in different worker
processes, so a run is built once across the processes too: into a directory beside the
workers' own temporary directories (under `getbasetemp().parent` when `PYTEST_XDIST_WORKER` is
set, else under `getbasetemp()`), by whichever process comes first, under an exclusive
`flock`; the `.built` marker, written last, says it is complete. The others wait for the lock
and reuse the run read-only: a test that writes beside a run copies the part it needs first.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest

from tests import documented

BUILT = ".built"


def shared_root(tmp_path_factory) -> Path:
    """The directory every process of this test session sees (each xdist worker's basetemp is
    `<session temp>/popen-gwN`; without xdist, the basetemp is the session's own)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _locked(path: Path):
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """`shared-<name>/` of this session, built by `build(directory)` if no process has yet."""
    directory = shared_root(tmp_path_factory) / f"shared-{name}"
    with _locked(directory):
        if not (directory / BUILT).exists():
            shutil.rmtree(directory, ignore_errors=True)  # a build that failed half way
            directory.mkdir(parents=True)
            build(directory)
            (directory / BUILT).write_text("")
    return directory


def _records(data_dir) -> dict:
    """What a dataset holds: its info and the checksum of every shard, per split."""
    manifest = json.loads((Path(data_dir) / "dataset.json").read_text())
    return {"info": manifest["info"],
            "splits": {split: [shard["sha256"] for shard in value["shards"]]
                       for split, value in manifest["splits"].items()}}


@pytest.fixture(scope="session")
def text_lm_run(text_dir, tmp_path_factory) -> Path:
    """The shipped text_lm config trained for 60 steps of 64 windows (2 of its 4 epochs, taken
    as one: the same weights, one validation fewer) on the
    embedded text converted as conftest's `text_dir` converts it; the run directory
    (read-only). tests/test_language_model.py asks how well it learned (its thresholds need
    the 60 steps), tests/test_bits_per_byte.py how its bits_per_byte is computed.

    The run may have been trained in another process, on that process's `text_dir`: the same
    records (checked here, shard by shard), so each test may read its own `text_dir`."""
    def build(directory: Path) -> None:
        from tests.conftest import run_cli

        args = documented.replaced(documented.args(  # text_lm's `Run:` header command
            "tftrain train --config=text_lm --model_dir=runs/text_lm"),
            model_dir=str(directory / "run"))
        assert run_cli(*args, f"--params_override=data.dir={text_dir},train.epochs=1,"
                              "train.steps_per_epoch=60") == 0

    run = built_once(tmp_path_factory, "text_lm_run", build) / "run"
    trained_on = json.loads((run / "summary.json").read_text())["data_dir"]
    assert _records(trained_on) == _records(text_dir), (
        f"the shared run was trained on {trained_on}, whose records differ from {text_dir}")
    return run

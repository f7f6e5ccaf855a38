"""Fault injection: `tftrain convert` and `tftrain train` killed with SIGKILL at random moments.

Each command runs once uninterrupted first, as a subprocess of the console script: that is the
reference output and the measure of its run time. Then it is started again and killed
(SIGKILL to all its processes) at KILLS moments drawn by a seeded generator over that time, one
in each third of it, each time in the same directory and each followed by a rerun. After each
kill nothing passes for what it is not: the directory is not a complete dataset (or it is the
complete previous one), not a finished run (or it is the finished previous one). Each rerun
completes: the dataset byte-identical to the reference (the writer is deterministic given
input, workers and seed), the run with all its epochs. A round passes --overwrite when the
directory holds a complete result, as a user would. Reruns are the same command line run in
this process (`tftrain.cli.run`), which saves a TensorFlow start each (pytest's timeout, set
in setup.cfg, bounds them).
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import run_cli
from tests.test_convert_atomic import descendants, running
from tftrain import dir_lock
from tftrain.data import manifest as manifest_lib

pytestmark = pytest.mark.slow
TFTRAIN = os.path.join(os.path.dirname(sys.executable), "tftrain")
SEED = 20261201
KILLS = 3  # seeded moments, one in each third of the reference run time
BOUND = 240  # seconds any one command may take before the test calls it a hang
EPOCHS = 2


def kill_moments(seconds: float) -> list[float]:
    """KILLS moments in (0, seconds), one in each KILLS-th of it, from a seeded generator."""
    rng = random.Random(SEED)
    return [(k + rng.random()) * seconds / KILLS for k in range(KILLS)]


class Command:
    """One tftrain command line, run to its end or killed at a moment; logs under `logs`."""

    def __init__(self, args: list[str], logs, cwd):
        self.args, self.logs, self.cwd, self.count = args, logs, cwd, 0

    def _start(self, extra: list[str]):
        self.count += 1
        self.log_path = self.logs / f"run-{self.count}.log"
        log = open(self.log_path, "w")
        process = subprocess.Popen([TFTRAIN, *self.args, *extra], cwd=self.cwd, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return process

    def tail(self) -> str:
        return self.log_path.read_text()[-3000:]

    def rerun(self, extra: list[str] = ()) -> None:
        """Runs the same command line to the end in this process; it must succeed."""
        assert run_cli(*self.args, *extra) == 0

    def run(self, extra: list[str] = ()) -> float:
        """Runs to the end as a subprocess (it must succeed); returns its wall time."""
        started = time.monotonic()
        process = self._start(list(extra))
        try:
            assert process.wait(timeout=BOUND) == 0, self.tail()
        finally:
            _kill_group(process)
        return time.monotonic() - started

    def kill_at(self, moment: float, extra: list[str] = ()) -> bool:
        """Starts it and, `moment` seconds later, sends SIGKILL to all its processes (the
        converter's workers too: a killed job; test_convert_atomic kills the main process
        alone); returns False when it had already finished (successfully) by then."""
        process = self._start(list(extra))
        try:
            deadline = time.monotonic() + moment
            while time.monotonic() < deadline and process.poll() is None:
                time.sleep(0.01)
            if process.poll() is not None:
                assert process.returncode == 0, self.tail()
                return False
            helpers = descendants(process.pid)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            gone_by = time.monotonic() + 30
            while any(map(running, helpers)) and time.monotonic() < gone_by:
                time.sleep(0.01)
            assert not [pid for pid in helpers if running(pid)], "processes outlived the kill"
            return True
        finally:
            _kill_group(process)


def _kill_group(process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def dataset_files(path) -> dict:
    """{name: bytes} of a dataset directory's files (the lock file aside)."""
    return {name: (path / name).read_bytes() for name in sorted(os.listdir(path))
            if name != dir_lock.CONVERT_LOCK}


def assert_no_false_dataset(path, reference: dict) -> None:
    """`path` is not a dataset, or it is exactly the complete reference one."""
    if not manifest_lib.exists(str(path)):
        return
    manifest = manifest_lib.read(str(path))
    listed = {shard["file"] for split in manifest["splits"].values() for shard in split["shards"]}
    assert {name: (path / name).read_bytes() for name in listed | {"dataset.json"}} == reference


def test_convert_killed_at_random_moments_reruns_to_identical_output(tmp_path):
    reference_dir, out = tmp_path / "reference", tmp_path / "out"
    reference_run = Command(["convert", "--pipeline=digits", "--workers=2"], tmp_path, tmp_path)
    seconds = reference_run.run([f"--output={reference_dir}"])
    reference = dataset_files(reference_dir)
    assert len(reference) == 7  # dataset.json and 2 shards of each of 3 splits

    convert = Command(["convert", "--pipeline=digits", "--workers=2", f"--output={out}"],
                      tmp_path, tmp_path)
    for moment in kill_moments(seconds):
        killed = convert.kill_at(moment, ["--overwrite"] if manifest_lib.exists(str(out)) else [])
        assert_no_false_dataset(out, reference)
        if killed:
            convert.rerun(["--overwrite"] if manifest_lib.exists(str(out)) else [])
        assert dataset_files(out) == reference, f"killed at {moment:.2f}s of {seconds:.2f}s"


def finished_epochs(model_dir) -> int | None:
    summary = model_dir / "summary.json"
    return json.loads(summary.read_text())["epochs"] if summary.exists() else None


def assert_no_false_run(model_dir) -> None:
    """`model_dir` holds no finished run, or the complete finished previous one."""
    if finished_epochs(model_dir) is not None:
        assert finished_epochs(model_dir) == EPOCHS
        assert list(model_dir.glob("export/*/saved_model.pb"))


def test_train_killed_at_random_moments_resumes_to_all_its_epochs(tmp_path, digits_dir):
    model_dir = tmp_path / "run"
    # One device, also in this process (which has two); a small model, to stay fast.
    args = ["train", "--config=digits", f"--model_dir={model_dir}", "--strategy=one_device",
            f"--params_override=data.dir={digits_dir},train.epochs={EPOCHS},"
            "train.backup_every_steps=10,model.name=mlp,model.params={hidden_units: [32]}"]
    command = Command(args, tmp_path, tmp_path)
    seconds = command.run()
    assert finished_epochs(model_dir) == EPOCHS

    for moment in kill_moments(seconds):
        overwrite = ["--overwrite"] if finished_epochs(model_dir) else []
        killed = command.kill_at(moment, overwrite)
        assert_no_false_run(model_dir)
        if killed:
            command.rerun(["--overwrite"] if finished_epochs(model_dir) else [])
        assert finished_epochs(model_dir) == EPOCHS, f"killed at {moment:.2f}s of {seconds:.2f}s"
        assert not (model_dir / "backup").exists()

"""Fault injection: `tftrain convert` and `tftrain train` killed with SIGKILL at points they must
reach.

Each command runs once uninterrupted first, as a process of its own (a child of the forked-CLI
server, `tests/forked_cli.py`, as every attempt is): that is the reference output. Then it is
started again and killed (SIGKILL to all its processes) as soon as it reaches each of 3 points
in turn (a log line, or a file that only this attempt writes:
the conversion's plan, its marker, its first temporary shard; a training backup drawn by a
seeded generator in each of the first two thirds of the backups, the export being written), each
time in the same directory and each followed by a rerun. Every kill must land while the command
is still running (counted: a command that finished first fails the test). After each kill
nothing passes for what it is not: the directory is not a complete dataset (or it is the
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
import re
import signal
import time

import pytest

from tests import forked_cli
from tests.conftest import run_cli
from tests.test_convert_atomic import descendants, running
from tftrain import dir_lock, ownership
from tftrain.data import manifest as manifest_lib

pytestmark = pytest.mark.slow
SEED = 20261201  # draws the training backups to kill after; in every failure message
BOUND = 240  # seconds any one command may take before the test calls it a hang
EPOCHS = 2
BACKUPS = 9  # backups (every 10 steps, and at epoch ends) a training attempt writes before its last


class Command:
    """One tftrain command line, run to its end or killed at a point; logs under `logs`."""

    def __init__(self, args: list[str], logs, cwd):
        self.args, self.logs, self.cwd, self.count = args, logs, cwd, 0

    def _start(self, extra: list[str]):
        self.count += 1
        self.log_path = self.logs / f"run-{self.count}.log"
        with open(self.log_path, "w") as log:
            return forked_cli.Popen([*self.args, *extra], cwd=self.cwd, stdout=log,
                                    stderr=forked_cli.STDOUT)

    def tail(self) -> str:
        return self.log_path.read_text()[-3000:]

    def logged(self, pattern: str) -> bool:
        """True once this attempt's log has a line matching `pattern`."""
        return re.search(pattern, self.log_path.read_text(), re.MULTILINE) is not None

    def rerun(self, extra: list[str] = ()) -> None:
        """Runs the same command line to the end in this process; it must succeed."""
        assert run_cli(*self.args, *extra) == 0

    def run(self, extra: list[str] = ()) -> None:
        """Runs to the end as a process of its own; it must succeed."""
        process = self._start(list(extra))
        try:
            assert process.wait(timeout=BOUND) == 0, self.tail()
        finally:
            _kill_group(process)

    def kill_when(self, reached, extra: list[str] = ()) -> bool:
        """Starts it and, as soon as `reached()` (polled), sends SIGKILL to all its processes
        (the converter's workers too: a killed job; test_convert_atomic kills the main process
        alone); True when the kill landed, False when the command had finished (successfully)
        before it did."""
        process = self._start(list(extra))
        try:
            deadline = time.monotonic() + BOUND
            while process.poll() is None and not reached():
                assert time.monotonic() < deadline, f"not reached in {BOUND}s:\n{self.tail()}"
                time.sleep(0.01)
            helpers = descendants(process.pid)
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            code = process.wait(timeout=30)
            if code != -signal.SIGKILL:  # it ended before the signal
                assert code == 0, self.tail()
                return False
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


def test_convert_killed_at_each_stage_reruns_to_identical_output(tmp_path):
    reference_dir, out = tmp_path / "reference", tmp_path / "out"
    Command(["convert", "--pipeline=digits", "--workers=2"], tmp_path, tmp_path).run(
        [f"--output={reference_dir}"])
    reference = dataset_files(reference_dir)
    assert len(reference) == 7  # dataset.json and 2 shards of each of 3 splits

    convert = Command(["convert", "--pipeline=digits", "--workers=2", f"--output={out}"],
                      tmp_path, tmp_path)

    def temporary_shard() -> bool:  # a shard being written (only this attempt has them)
        return out.is_dir() and any(name.startswith(".") and ".tfrecord.tmp-" in name
                                    for name in os.listdir(out))

    points = {  # in the order a conversion reaches them
        "the plan is logged": lambda: convert.logged(r"\] convert: 1,797 rows"),
        "the conversion marker exists": lambda: (out / ownership.CONVERT_MARKER).exists(),
        "a shard is being written": temporary_shard,
    }
    kills = []
    for point, reached in points.items():
        killed = convert.kill_when(reached, ["--overwrite"] if manifest_lib.exists(str(out))
                                   else [])
        assert_no_false_dataset(out, reference)
        assert killed, f"the conversion finished before the kill at: {point}"
        kills.append(point)
        convert.rerun(["--overwrite"] if manifest_lib.exists(str(out)) else [])
        assert dataset_files(out) == reference, f"killed when {point}"
    assert len(kills) == len(points) == 3, kills


def finished_epochs(model_dir) -> int | None:
    summary = model_dir / "summary.json"
    return json.loads(summary.read_text())["epochs"] if summary.exists() else None


def assert_no_false_run(model_dir) -> None:
    """`model_dir` holds no finished run, or the complete finished previous one."""
    if finished_epochs(model_dir) is not None:
        assert finished_epochs(model_dir) == EPOCHS
        assert list(model_dir.glob("export/*/saved_model.pb"))


def test_train_killed_at_backups_and_export_resumes_to_all_its_epochs(tmp_path, digits_dir):
    model_dir = tmp_path / "run"
    # One device, also in this process (which has two); a small model, to stay fast.
    args = ["train", "--config=digits", f"--model_dir={model_dir}", "--strategy=one_device",
            f"--params_override=data.dir={digits_dir},train.epochs={EPOCHS},"
            "train.backup_every_steps=10,model.name=mlp,model.params={hidden_units: [32]}"]
    command = Command(args, tmp_path, tmp_path)
    command.run()
    assert finished_epochs(model_dir) == EPOCHS
    assert not (model_dir / "backup").exists()  # so every backup below is the attempt's own

    # A backup drawn in each of the first two thirds of them, then the export being written.
    rng = random.Random(SEED)
    third = BACKUPS // 3
    backups = [k * third + rng.randint(1, third) for k in range(2)]
    points = {f"backup ckpt-{n} is written": (
        lambda n=n: (model_dir / "backup" / "chief" / f"ckpt-{n}.index").exists())
        for n in backups}
    points["the export is being written"] = lambda: any((model_dir / "export").glob("*.tmp"))
    kills = []
    for point, reached in points.items():
        overwrite = ["--overwrite"] if finished_epochs(model_dir) else []
        killed = command.kill_when(reached, overwrite)
        assert_no_false_run(model_dir)
        assert killed, f"SEED={SEED}: the run finished before the kill at: {point}"
        kills.append(point)
        command.rerun(["--overwrite"] if finished_epochs(model_dir) else [])
        assert finished_epochs(model_dir) == EPOCHS, f"SEED={SEED}: killed when {point}"
        assert not (model_dir / "backup").exists()
    assert len(kills) == len(points) == 3, kills

"""Fault tolerance: a training process killed with SIGKILL or SIGTERM resumes on the same command."""
import json
import os
import signal
import time

import pytest

from tests import forked_cli
from tftrain.callbacks.preemption import PREEMPTED_EXIT_CODE

EPOCHS, STEPS_PER_EPOCH = 3, 30
pytestmark = pytest.mark.slow


def _command(model_dir, data_dir):
    overrides = (f"data.dir={data_dir},train.epochs={EPOCHS},train.steps_per_epoch={STEPS_PER_EPOCH},"
                 "train.backup_every_steps=5,model.name=mlp,model.params={hidden_units: [32]},"
                 "data.batch_size=16")
    return ["train", f"--model_dir={model_dir}", f"--params_override={overrides}"]


def _start(command, log_path):
    log = open(log_path, "w")
    return forked_cli.Popen(command, stdout=log, stderr=forked_cli.STDOUT), log


def _wait_for_backup(process, model_dir, timeout=180):
    """Waits until the first backup is on disk while the run is still training."""
    marker = os.path.join(model_dir, "backup", "chief", "checkpoint")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(marker):
            return
        assert process.poll() is None, "training ended before its first backup"
        time.sleep(0.02)
    raise AssertionError(f"no backup in {model_dir} after {timeout}s")


def _finish(process, log, timeout=300):
    try:
        return process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def _rerun_and_check(command, model_dir, tmp_path):
    rerun, log = _start(command, tmp_path / "rerun.log")
    assert _finish(rerun, log) == 0, (tmp_path / "rerun.log").read_text()[-3000:]
    output = (tmp_path / "rerun.log").read_text()
    assert "resumed from epoch" in output
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["epochs"] == EPOCHS
    assert summary["steps"] == EPOCHS * STEPS_PER_EPOCH  # no update lost or repeated
    assert summary["resumed_from"] is not None
    assert not (model_dir / "backup").exists()  # deleted once the run finished
    return summary


def test_sigkill_mid_epoch_then_same_command_resumes(tmp_path, digits_dir):
    model_dir = tmp_path / "run"
    command = _command(model_dir, digits_dir)
    first, log = _start(command, tmp_path / "first.log")
    try:
        _wait_for_backup(first, str(model_dir))
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        _finish(first, log)
    assert not (model_dir / "summary.json").exists()
    summary = _rerun_and_check(command, model_dir, tmp_path)
    # The backup is at most backup_every_steps old: the rerun started at a 5-step boundary.
    epoch, step = summary["resumed_from"]
    assert 0 <= epoch < EPOCHS and step % 5 == 0


def test_sigterm_backs_up_and_exits_143_then_resumes(tmp_path, digits_dir):
    model_dir = tmp_path / "run"
    command = _command(model_dir, digits_dir)
    first, log = _start(command, tmp_path / "first.log")
    try:
        _wait_for_backup(first, str(model_dir))
        first.send_signal(signal.SIGTERM)
        code = first.wait(timeout=120)
    finally:
        _finish(first, log)
    output = (tmp_path / "first.log").read_text()
    assert code == PREEMPTED_EXIT_CODE, output[-3000:]
    assert "stopped by SIGTERM" in output and "run the same command again" in output
    assert not (model_dir / "summary.json").exists()
    _rerun_and_check(command, model_dir, tmp_path)

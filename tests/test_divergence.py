"""The divergence guard (`train.on_nan`): SGD at a learning rate of 1e12 really diverges on
digits (the loss is NaN by the third step); `stop` ends the run in one line naming the step and
the last finite loss and leaves only finite backups; `rollback` restores the last backup with a
lower rate and trains on, also over 2 replicas, and a resumed run keeps the lowered rate."""
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from tftrain import config as config_lib
from tftrain.engine import train
from tftrain.callbacks.divergence import Diverged
from tftrain.callbacks.preemption import Preempted
from tftrain.errors import ConfigError
from tests.test_resume_state import SigtermWhen, curve

SMALL = ("model.name=mlp,model.params={hidden_units: [16]},data.batch_size=16,"
         "train.optimizer=sgd,train.steps_per_epoch=5")
DIVERGING = "train.learning_rate=1.0e12,train.lr_schedule=constant"
# One rollback brings the rate from 1e12 to 0.1, which trains.
RECOVERING = "train.on_nan=rollback,train.rollback_lr_factor=1.0e-13"


def _config(digits_dir, overrides):
    return config_lib.build_config("digits", overrides=f"data.dir={digits_dir},{SMALL},{overrides}")


def _assert_finite_backup(model_dir):
    path = tf.train.latest_checkpoint(os.path.join(model_dir, "backup", "chief"))
    assert path, "no backup written"
    reader = tf.train.load_checkpoint(path)
    for name, dtype in reader.get_variable_to_dtype_map().items():
        if dtype.is_floating and name.startswith("model/"):  # weights and optimizer state
            assert np.all(np.isfinite(reader.get_tensor(name))), name


def test_nan_loss_stops_in_one_line_and_keeps_a_finite_backup(tmp_path, digits_dir, cli, capsys):
    model_dir = tmp_path / "run"
    code = cli("train", f"--model_dir={model_dir}", f"--params_override=data.dir={digits_dir},"
               f"{SMALL},{DIVERGING},train.epochs=2,train.backup_every_steps=1")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == Diverged.exit_code != 0
    assert "Traceback" not in "\n".join(err)
    assert err[-1].startswith("tftrain train: error: training diverged: the ")
    assert "at epoch 1" in err[-1] and "the last finite loss was" in err[-1]
    assert "train.on_nan=rollback" in err[-1]
    assert not (model_dir / "summary.json").exists()
    _assert_finite_backup(str(model_dir))  # a rerun resumes from good weights, never NaN ones


def test_rollback_lowers_the_rate_and_trains_on(tmp_path, digits_dir, caplog):
    model_dir = str(tmp_path / "run")
    config = _config(digits_dir, f"{DIVERGING},{RECOVERING},train.epochs=2")
    summary = train.train(config, model_dir)
    assert summary["rollbacks"] == 1
    assert "divergence guard: the" in caplog.text and "rolled back to ckpt-1" in caplog.text
    assert curve(model_dir, "learning_rate") == pytest.approx([0.1, 0.1])
    assert np.isfinite(summary["eval"]["loss"]) and summary["eval"]["loss"] < 2.3  # it learned
    # The updates before the rollback were undone with the optimizer state: fewer than 10 steps.
    assert 5 <= summary["steps"] < 10


def test_rollbacks_are_bounded(tmp_path, digits_dir):
    config = _config(digits_dir, "train.learning_rate=1.0e30,train.lr_schedule=constant,"
                                 "train.on_nan=rollback,train.max_rollbacks=2,train.epochs=1")
    with pytest.raises(Diverged, match=r"training diverged after 2 rollback\(s\) "
                                       r"\(train.max_rollbacks=2\): the .* at "):
        train.train(config, str(tmp_path / "run"))


def test_rollback_of_a_schedule_over_two_replicas_survives_a_resume(tmp_path, digits_dir):
    # Cosine schedule, so the rate is lowered through the schedule's scale (saved in the
    # backup); preempted after the rollback, resumed: the scale and the count come back, so
    # the resumed epochs do not diverge again (which would count a second rollback).
    overrides = ("train.learning_rate=1.0e12,train.lr_schedule=cosine,train.lr_min=0,"
                 f"{RECOVERING},train.epochs=3,runtime.strategy=mirrored,runtime.cpu_devices=2")
    model_dir = str(tmp_path / "run")
    # ckpt-1 is the backup before the first step (the rollback point), ckpt-2 epoch 1's.
    marker = os.path.join(model_dir, "backup", "chief", "ckpt-2.index")
    with SigtermWhen(marker) as sigterm, pytest.raises(Preempted):
        train.train(_config(digits_dir, overrides), model_dir)
    assert sigterm.sent
    summary = train.train(_config(digits_dir, overrides), model_dir)
    assert summary["num_replicas"] == 2 and summary["resumed_from"] is not None
    assert summary["rollbacks"] == 1
    rates = curve(model_dir, "learning_rate")
    assert len(rates) == 3 and all(0 <= rate <= 0.1 for rate in rates)
    assert np.isfinite(summary["eval"]["loss"])


@pytest.mark.parametrize("override, message", [
    ("train.on_nan=skip", "train.on_nan='skip' is not one of stop, rollback"),
    ("train.rollback_lr_factor=1.5", "train.rollback_lr_factor must be between 0 and 1"),
    ("train.max_rollbacks=-1", "train.max_rollbacks must be >= 0"),
])
def test_guard_config_is_checked(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        config_lib.build_config("digits", overrides=override)


def test_rollback_under_two_workers_on_loopback(tmp_path, digits_dir):
    """MultiWorkerMirrored: the all-reduced loss is NaN on both workers at the same step, both
    restore the chief's backup with the same lowered rate, and they end with equal weights.

    The two workers are `tftrain train --worker_hosts=... --task_index=i` processes (forked, on
    loopback), not a `tftrain launch`: the launcher starts a server of its own that imports
    TensorFlow again (~5 s of CPU), and what is asserted here is the guard's, not the
    launcher's (tests/test_launch*.py)."""
    from tests.launch_testutil import Running, group_gone
    from tftrain.runtime.launch import free_ports

    model_dir, weights = tmp_path / "run", tmp_path / "weights"
    hosts = ",".join(f"127.0.0.1:{port}" for port in free_ports(2))
    args = ["train", f"--worker_hosts={hosts}", f"--model_dir={model_dir}",
            f"--params_override=data.dir={digits_dir},{SMALL},{DIVERGING},{RECOVERING},"
            "train.epochs=2"]
    env = {"TFTRAIN_DUMP_WEIGHTS_DIR": str(weights), "TMPDIR": str(tmp_path)}
    workers = [Running(args + [f"--task_index={i}"], cwd=tmp_path, env=env) for i in range(2)]
    try:
        codes = [w.wait(360) for w in workers]
    finally:
        for w in workers:
            w.kill_all()
    assert codes == [0, 0], workers[0].tail() + "\n-----\n" + workers[1].tail()
    # Nothing either worker started outlived it (each is the leader of its own process group).
    assert all(group_gone(w.process.pid) for w in workers)
    rolled = [[line for line in w.lines if "divergence guard: the" in line] for w in workers]
    for worker, lines in enumerate(rolled):
        assert len(lines) == 1, workers[worker].output
        assert "rolled back to ckpt-1 (optimizer step 0)" in lines[0], lines[0]
    # The same step on both workers (the loss they see is the all-reduced one).
    where = [re.search(r"at (epoch \d+ step \d+)", lines[0]).group(1) for lines in rolled]
    assert where[0] == where[1], where
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["rollbacks"] == 1 and summary["num_workers"] == 2
    assert np.isfinite(summary["eval"]["loss"]) and summary["eval"]["loss"] < 2.3
    assert curve(str(model_dir), "learning_rate") == pytest.approx([0.1, 0.1])
    chief, other = (np.load(weights / f"worker-{i}.npz") for i in range(2))
    assert len(chief.files) == len(other.files) > 0
    for name in chief.files:
        np.testing.assert_array_equal(chief[name], other[name])

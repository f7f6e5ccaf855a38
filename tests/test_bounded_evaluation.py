"""Large data, end to end through the CLI and without a TTY (stdout is a pipe here, as under
SLURM, Kubernetes, nohup or CI): validation every N steps on N batches, a bounded final test,
and a progress line (and TensorBoard scalars) every N steps."""
import glob
import json
import os
import re

import numpy as np
import pytest

from tests import forked_cli
from tests.conftest import REPO

BOUNDS = ("train.steps=40,train.validation_every_steps=10,train.validation_steps=2,"
          "train.test_steps=3,train.log_every_steps=5")


@pytest.fixture(scope="module")
def bounded_run(tmp_path_factory, digits_dir):
    run = tmp_path_factory.mktemp("bounded") / "run"
    done = forked_cli.run(
        ["train", "--config=digits", f"--model_dir={run}",
         f"--params_override=data.dir={digits_dir},{BOUNDS}"],
        cwd=REPO, timeout=600, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    return run, done


def test_progress_lines_every_n_steps_without_a_tty(bounded_run):
    _, done = bounded_run
    steps = [int(s) for s in re.findall(r"step (\d+)/40 loss=\d+\.\d{4} grad_norm=\d[\d.e+-]* "
                                        r"[\d,]+ examples/s mfu=\d+\.\d\d% ETA \d+",
                                        done.stderr)]
    assert steps == list(range(5, 41, 5)), done.stderr[-3000:]


def test_the_summary_records_model_flops_utilization(bounded_run, digits_dir):
    """MFU = the model's training FLOPs per example x examples/s over this host's measured
    matmul peak (the devices share it on a CPU)."""
    from tftrain import config as config_lib
    from tftrain import models, tasks
    from tftrain.models import flops

    run, _ = bounded_run
    summary = json.loads((run / "summary.json").read_text())
    config = config_lib.build_config("digits", overrides=f"data.dir={digits_dir}")
    with open(f"{digits_dir}/dataset.json") as f:
        config, _ = tasks.resolve(config, json.load(f))  # model.name=auto: the run's cnn
    model = models.build_model(config.model.name, config.model.params, (8, 8, 1), 10)
    assert summary["model_flops_per_example"] == flops.training_flops_per_example(model) > 0
    assert summary["achieved_flops_per_second"] == pytest.approx(
        summary["model_flops_per_example"] * summary["examples_per_second"])
    assert summary["peak_source"].startswith("measured on this host")
    assert summary["peak_devices"] == 1
    assert 0 < summary["mfu"] < 1
    assert summary["mfu"] == pytest.approx(
        summary["achieved_flops_per_second"] / summary["peak_flops_per_second"], rel=1e-4)


def test_validation_every_n_steps_drives_the_epochs(bounded_run):
    run, _ = bounded_run
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 40 and summary["epochs"] == 4  # one validation per 10 steps
    assert summary["evaluation"] == {"validation_steps": 2, "validation_every_steps": 10,
                                     "test_steps": 3}
    curves = json.loads((run / "curves.json").read_text())["epochs"]
    assert len(curves) == 4 and all("val_loss" in epoch for epoch in curves), curves


def test_validation_and_test_read_only_their_batches(bounded_run, digits_dir):
    """The summary's numbers are the exported model's on the first 2 validation batches and the
    first 3 test batches (32 examples each), not on the whole splits."""
    import tf_keras as keras

    from tftrain.data import reader

    run, _ = bounded_run
    summary = json.loads((run / "summary.json").read_text())
    model = keras.models.load_model(glob.glob(str(run / "export" / "*"))[0])

    def accuracy(split: str, batches: int) -> float:
        right = total = 0
        for inputs, labels in reader.load(digits_dir, split, 32, training=False).take(batches):
            predicted = np.argmax(model(inputs, training=False), axis=-1)
            right += int(np.sum(predicted == labels.numpy()))
            total += len(labels)
        return right / total

    assert summary["eval"]["accuracy"] == pytest.approx(accuracy("test", 3), abs=1e-6)
    assert summary["validation"]["accuracy"] == pytest.approx(accuracy("validation", 2),
                                                              abs=1e-6)


def test_progress_scalars_in_tensorboard_at_the_same_steps(bounded_run):
    import tensorflow as tf

    run, _ = bounded_run
    found = {}
    for path in glob.glob(str(run / "logs" / "train" / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                found.setdefault(value.tag, []).append(event.step)
    assert sorted(found["progress/loss"]) == list(range(5, 41, 5)), found.keys()
    assert sorted(found["progress/examples_per_second"]) == list(range(5, 41, 5))
    assert sorted(found["gradients/norm"]) == list(range(1, 41))  # every step's


def test_every_run_measures_its_gradient_norm(bounded_run):
    """Clipping off (digits' default): every update measured, none clipped; the progress
    lines show the norm of the step they name, the last one summary.json's."""
    run, done = bounded_run
    gradients = json.loads((run / "summary.json").read_text())["gradients"]
    assert gradients["clip_global_norm"] == 0.0
    assert (gradients["clipped_steps"], gradients["clipped_fraction"]) == (0, 0.0)
    assert 0 < gradients["last_norm"] <= gradients["max_norm"] < 100
    shown = re.findall(r"step 40/40 loss=\S+ grad_norm=(\S+) ", done.stderr)
    assert shown and float(shown[0]) == pytest.approx(gradients["last_norm"], rel=1e-3)


@pytest.mark.parametrize("key", ["validation_steps", "validation_every_steps", "test_steps",
                                 "log_every_steps"])
def test_the_keys_are_checked_by_name(key, tmp_path):
    done = forked_cli.run(["train", "--config=digits", f"--model_dir={tmp_path}/r",
                           f"--params_override=train.{key}=-1"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and f"train.{key} must be >= 0, got -1" in done.stderr
    assert "Traceback" not in done.stderr

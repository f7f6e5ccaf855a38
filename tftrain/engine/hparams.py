"""The run's config and final metrics in TensorBoard's HParams plugin, so runs compare in its table.

Written once, at the end of a run, into `model_dir/logs` (beside `train/` and `validation/`):
every config value as a hyperparameter (dicts and lists as JSON text), the test split's metrics
as `test/<metric>` scalars, and the per-epoch validation metrics that Keras's TensorBoard
callback already writes (`epoch_<metric>` in `validation/`) declared as the table's metrics.
`tensorboard --logdir RUNS_ROOT` then lists every run as one row.
"""
from __future__ import annotations

import dataclasses
import json

import tensorflow as tf
from tensorboard.plugins.hparams import api as hp


def flat_values(config) -> dict:
    """{"train.learning_rate": 0.002, "model.params": '{"filters": [32, 64]}', ...}."""
    flat = {}
    for section, values in dataclasses.asdict(config).items():
        for key, value in values.items():
            if not isinstance(value, (bool, int, float, str)) and value is not None:
                value = json.dumps(value, sort_keys=True)
            flat[f"{section}.{key}"] = "" if value is None else value
    return flat


def write(log_dir: str, config, test_metrics: dict, validation_metrics: dict, step: int,
          trial_id: str) -> None:
    """Writes the HParams session of this run (see the module docstring) into `log_dir`."""
    values = flat_values(config)
    metrics = [hp.Metric(f"test/{name}", display_name=f"test {name}") for name in test_metrics]
    metrics += [hp.Metric(f"epoch_{name}", group="validation", display_name=f"validation {name}")
                for name in validation_metrics]
    writer = tf.summary.create_file_writer(log_dir)
    with writer.as_default():
        hp.hparams_config(hparams=[hp.HParam(key) for key in values], metrics=metrics)
        hp.hparams(values, trial_id=trial_id)
        for name, value in test_metrics.items():
            tf.summary.scalar(f"test/{name}", value, step=step)
    writer.close()

"""Fast unit tests of the pure pieces a run is made of (no model, no training): the step plan,
the typed manifest, the summary record, optimizer state, the fine-tuning schedule."""
import weakref

import pytest

from tftrain import config_schema
from tftrain.data import manifest as manifest_lib
from tftrain.engine import prepare
from tftrain.engine.train import RunSummary
from tftrain.errors import DataError
from tftrain.models import fine_tuning
from tftrain.training import optimizers, steps

CHECKED = {"format": manifest_lib.FORMAT, "pipeline": "digits", "features": {}, "info": {},
           "splits": {"train": {"num_examples": 100, "shards": [
               {"file": "train-00000-of-00001.tfrecord", "num_examples": 100, "bytes": 9000,
                "sha256": "0" * 64}]}}}
FOREIGN = {"pipeline": "digits", "info": {"num_classes": 10}, "features": {}, "format": "tfrecord",
           "splits": {"train": {"shards": [{"file": "/x/train-0"}, {"file": "/x/train-1"}],
                                "num_examples": 7},
                      "test": {"shards": [{"file": "/x/test-0"}]}}}


def test_the_typed_manifest_is_what_validation_returns():
    assert manifest_lib.typed(CHECKED) == manifest_lib.validate(CHECKED)
    assert manifest_lib.typed(CHECKED).splits["train"].bytes == 9000


def test_other_tools_records_are_typed_with_what_is_known():
    dataset = manifest_lib.typed(FOREIGN)
    assert dataset.examples("train") == 7 and dataset.splits["train"].bytes == 0
    assert dataset.splits["test"].num_examples is None and dataset.info == {"num_classes": 10}
    with pytest.raises(DataError, match="no counted split 'test'; it has: test, train"):
        dataset.examples("test")


def test_the_plan_refuses_a_split_smaller_than_one_step():
    config = config_schema.Config()
    config.data.batch_size, config.train.grad_accum_steps = 32, 4
    with pytest.raises(DataError, match="has 100 examples, fewer than one step's 128"):
        prepare.plan_for(config, CHECKED)
    config.train.grad_accum_steps = 1
    assert prepare.plan_for(config, CHECKED) == steps.plan_steps(config.train, 100, 32)


def test_the_summary_keeps_summary_json_keys_in_order():
    summary = RunSummary(
        model_dir="m", data_dir="d", task={"type": "classification"}, parameters=1000,
        memory={"weights_bytes_per_device": 4000, "optimizer_bytes_per_device": 8000},
        epochs=2, steps=10,
        eval={"split": "test", "accuracy": 0.9}, validation={"accuracy": 0.8},
        ema={"decay": 0.999, "evaluated": True},
        evaluation={"validation_steps": 0, "validation_every_steps": 0, "test_steps": 0},
        mixed_precision="float32", grad_accum_steps=1,
        gradients={"clip_global_norm": 0.0, "last_norm": 1.5, "max_norm": 2.5,
                   "clipped_steps": 0, "clipped_fraction": 0.0},
        resumed_from=None, seconds_per_step=0.1,
        examples_per_second=320.0,
        utilization={"model_flops_per_example": 6000, "achieved_flops_per_second": 1.92e6,
                     "peak_flops_per_second": 1e11, "peak_source": "measured",
                     "peak_devices": 1, "mfu": 1.92e-5},
        rollbacks=0, restarts={"restarts": 0, "restart_causes": []},
        backup={"async": True, "count": 3, "blocked_seconds": 0.1, "write_seconds": 0.5,
                "bytes": 1000},
        backend={"strategy": "one_device", "num_replicas": 1, "num_workers": 1,
                 "jit_compile": False}).to_json()
    assert list(summary) == [
        "model_dir", "data_dir", "task", "parameters", "memory", "epochs", "steps", "eval",
        "validation", "ema", "evaluation",
        "mixed_precision", "grad_accum_steps", "gradients", "resumed_from", "backup", "restarts",
        "restart_causes",
        "seconds_per_step", "examples_per_second", "model_flops_per_example",
        "achieved_flops_per_second", "peak_flops_per_second", "peak_source", "peak_devices",
        "mfu", "rollbacks", "strategy", "num_replicas",
        "num_workers", "jit_compile"]


def test_optimizer_state_per_weight_is_what_tf_keras_builds():
    import tensorflow as tf

    weights = [tf.Variable(tf.zeros([3, 4])), tf.Variable(tf.zeros([4]))]
    for name in config_schema.OPTIMIZERS:
        train = config_schema.TrainConfig(optimizer=name, momentum=0.0)
        optimizer = optimizers.make_optimizer(train, 10, 10)
        optimizer.build(weights)
        state = sorted(tuple(v.shape) for v in optimizer.variables
                       if v is not optimizer.iterations)
        planned = sorted(s for w in weights for s in optimizers.slot_shapes(name, w.shape))
        assert state == planned, (name, optimizer.variables)


def test_a_fine_tuning_schedule_is_data_kept_beside_the_model():
    class Model:  # any object a builder returns
        pass

    model, schedule = Model(), fine_tuning.UnfreezeSchedule(("layer",), 2, 0.1)
    assert fine_tuning.schedule_of(model) is None
    fine_tuning.schedule(model, schedule)
    assert fine_tuning.schedule_of(model) == schedule and not vars(model)
    gone = weakref.ref(model)
    del model
    assert gone() is None  # the record does not keep the model alive

"""`tftrain train` features on the digits dataset: schedules, steps, early stopping, checkpoints,
steps_per_execution, gradient accumulation, mixed precision, the run directory."""
import json
import math

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tftrain import config as config_lib
from tftrain.engine import backends, precision, train
from tftrain.training import optimizers, steps
from tftrain.errors import ConfigError
from tftrain.engine.export import saved_model_dir

SMALL_MODEL = "model.name=mlp,model.params={hidden_units: [32], dropout: 0.0}"


def _config(digits_dir, overrides=""):
    return config_lib.build_config(
        "digits", overrides=f"data.dir={digits_dir},{SMALL_MODEL},train.epochs=2,"
                            f"train.steps_per_epoch=6,{overrides}")


def _scalars(log_dir, tag):
    values = []
    for path in tf.io.gfile.glob(f"{log_dir}/events.out.tfevents*"):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    values.append(float(tf.make_ndarray(value.tensor)))
    return values


COSINE = ("train.steps=14,train.lr_schedule=cosine,train.warmup_steps=3,"
          "train.steps_per_execution=2,train.optimizer=sgd")


@pytest.fixture(scope="module")
def cosine_run(tmp_path_factory, digits_dir):
    """14 steps under a warmed-up cosine schedule: `(run dir, returned summary)`."""
    run = tmp_path_factory.mktemp("cosine")
    return run, train.train(_config(digits_dir, COSINE), str(run))


def test_cosine_warmup_lr_in_tensorboard_best_checkpoint_and_steps(cosine_run, digits_dir):
    tmp_path, summary = cosine_run
    config = _config(digits_dir, COSINE)
    assert summary["steps"] == 14 and summary["epochs"] == 3  # 6 + 6 + 2 steps
    rates = _scalars(tmp_path / "logs/train", "epoch_learning_rate")
    assert len(rates) == 3 and rates[0] > rates[1] > rates[2]  # cosine decay after warmup
    assert tf.io.gfile.glob(str(tmp_path / "checkpoints/best.index"))
    assert summary["seconds_per_step"] > 0 and summary["examples_per_second"] > 0
    assert not (tmp_path / "backup").exists()
    with pytest.raises(Exception, match="holds a finished run"):
        train.train(config, str(tmp_path))


def test_early_stopping_on_a_flat_metric(tmp_path, digits_dir):
    config = _config(digits_dir, "train.epochs=6,train.learning_rate=1.0e-12,"
                                 "train.early_stopping_patience=1,train.monitor=val_accuracy")
    summary = train.train(config, str(tmp_path))
    assert summary["epochs"] == 2  # the best epoch, then one without improvement


def test_reduce_on_plateau_lowers_the_rate(tmp_path, digits_dir):
    config = _config(digits_dir, "train.epochs=4,train.learning_rate=1.0e-9,train.lr_schedule=plateau,"
                                 "train.plateau_patience=1,train.lr_decay_rate=0.5,"
                                 "train.monitor=val_loss")
    train.train(config, str(tmp_path))
    rates = _scalars(tmp_path / "logs/train", "epoch_learning_rate")
    assert rates[0] == pytest.approx(1e-9) and rates[-1] < rates[0]


@pytest.fixture(scope="module")
def two_replica_run(tmp_path_factory, digits_dir):
    """One run on 2 replicas asked two questions: gradient accumulation (2 micro-batches of 16
    a step) and the decoded cache (2 epochs of 50 steps of 32 examples: 1,600 > the 1,426
    training examples, so the cache is reread). `(run dir, returned summary)`."""
    run = tmp_path_factory.mktemp("two_replicas")
    config = _config(digits_dir, "train.grad_accum_steps=2,runtime.strategy=mirrored,"
                                 "runtime.cpu_devices=2,data.batch_size=16,data.cache=decoded,"
                                 "train.steps_per_epoch=50")
    return run, train.train(config, str(run))


def test_grad_accum_and_two_replicas_end_to_end(two_replica_run):
    tmp_path, summary = two_replica_run
    assert summary["num_replicas"] == 2 and summary["grad_accum_steps"] == 2
    assert summary["steps"] == 100 and math.isfinite(summary["eval"]["loss"])
    exported = keras.models.load_model(saved_model_dir(str(tmp_path / "export")), compile=False)
    assert exported.name == "mlp"  # the model itself, not the accumulation wrapper


def test_decoded_cache_trains_over_two_replicas(two_replica_run):
    _, summary = two_replica_run
    assert summary["num_replicas"] == 2 and summary["steps"] == 100
    # learned from matching images and labels (chance: 0.1); this run measures 0.63
    assert summary["eval"]["accuracy"] > 0.4


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_float32_outputs_finite_loss(tmp_path, digits_dir, policy):
    try:
        summary = train.train(_config(digits_dir, f"runtime.mixed_precision={policy}"), str(tmp_path))
        with tf.distribute.get_strategy().scope():
            model = keras.models.load_model(saved_model_dir(str(tmp_path / "export")), compile=False)
        assert model.dtype_policy.name == policy
        assert model(np.zeros((2, 8, 8, 1), "float32")).dtype == tf.float32
        assert summary["mixed_precision"] == policy and math.isfinite(summary["eval"]["loss"])
        trainer = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        trainer.compile(optimizers.make_optimizer(config_lib.TrainConfig(), 10, 10), "mse")
        wrapped = isinstance(trainer.optimizer, keras.mixed_precision.LossScaleOptimizer)
        assert wrapped == (policy == "mixed_float16")  # loss scaling for float16 only
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_auto_precision_is_float32_on_cpu():
    assert precision.resolve_policy("auto", tf.distribute.get_strategy()) == "float32"


def test_schedules():
    def rate(overrides, steps_per_epoch=10, total=100, step=0):
        cfg = config_lib.build_config("digits", overrides=overrides).train
        lr = optimizers.make_schedule(cfg, steps_per_epoch, total)
        return float(lr(step)) if callable(lr) else lr

    assert rate("train.learning_rate=0.1,train.lr_schedule=constant") == 0.1
    assert rate("train.learning_rate=0.1,train.lr_schedule=step,train.lr_decay_epochs=2",
                step=19) == pytest.approx(0.1)
    assert rate("train.learning_rate=0.1,train.lr_schedule=step,train.lr_decay_epochs=2",
                step=20) == pytest.approx(0.01)
    warm = "train.learning_rate=0.1,train.lr_schedule=cosine,train.warmup_steps=10,train.lr_min=0.001"
    assert rate(warm, step=0) == pytest.approx(0.01)
    assert rate(warm, step=9) == pytest.approx(0.1)
    assert rate(warm, step=10) == pytest.approx(0.1)
    assert rate(warm, step=100) == pytest.approx(0.001)
    assert rate("train.learning_rate=0.1,train.warmup_steps=4", step=1) == pytest.approx(0.05)
    assert isinstance(optimizers.make_optimizer(
        config_lib.build_config("digits", overrides="train.optimizer=adamw").train, 1, 1),
        keras.optimizers.AdamW)


def test_plan_steps():
    cfg = config_lib.TrainConfig(epochs=3)
    assert steps.plan_steps(cfg, 100, 32) == steps.StepPlan(3, 3, 9)
    cfg = config_lib.TrainConfig(steps=10, steps_per_epoch=4)
    assert steps.plan_steps(cfg, 100, 32) == steps.StepPlan(4, 3, 10)
    assert steps.plan_steps(config_lib.TrainConfig(steps=2), 100, 32) == steps.StepPlan(2, 1, 2)


@pytest.mark.parametrize("override, message", [
    ("train.lr_schedule=linear", "not one of"),
    ("train.grad_accum_steps=0", "grad_accum_steps must be > 0"),
    ("train.lr_schedule=plateau,train.warmup_steps=5", "cannot be combined"),
    ("train.monitor=val_acc", "did you mean 'val_accuracy'"),
    ("train.backup_every_steps=-1", "backup_every_steps must be >= 0"),
])
def test_bad_training_config(override, message):
    with pytest.raises(ConfigError, match=message):
        config_lib.build_config("digits", overrides=override)


def test_summary_is_json(cosine_run):
    tmp_path, summary = cosine_run
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["steps"] == summary["steps"] == 14 and written["eval"] == summary["eval"]


def test_profiler_trace_hparams_and_xla(tmp_path, digits_dir):
    config = _config(digits_dir, "train.profile_steps='2,4',runtime.jit_compile=true")
    summary = train.train(config, str(tmp_path))
    assert summary["jit_compile"] is True
    # A trace tensorboard-plugin-profile opens: logs/plugins/profile/<run>/<host>.xplane.pb
    traces = tf.io.gfile.glob(f"{tmp_path}/logs/plugins/profile/*/*.xplane.pb")
    assert traces and tf.io.gfile.stat(traces[0]).length > 0
    # The HParams plugin's session (config values) and the test metrics, in logs/.
    tags, plugins = set(), set()
    for path in tf.io.gfile.glob(f"{tmp_path}/logs/events.out.tfevents*"):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tags.add(value.tag)
                plugins.add(value.metadata.plugin_data.plugin_name)
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= tags and "hparams" in plugins
    np.testing.assert_allclose(_scalars(tmp_path / "logs", "test/accuracy"),
                               [summary["eval"]["accuracy"]], rtol=1e-6)


def test_profile_steps_and_jit_compile_are_checked():
    with pytest.raises(ConfigError, match="train.profile_steps='5,2'"):
        config_lib.build_config("digits", overrides="train.profile_steps='5,2'")
    with pytest.raises(ConfigError, match="runtime.jit_compile='maybe' is not one of auto, true"):
        config_lib.build_config("digits", overrides="runtime.jit_compile=maybe")
    assert config_lib.build_config("digits", overrides="runtime.jit_compile=false").runtime.jit_compile == "false"
    assert not backends.use_xla("auto")  # no GPU here: XLA stays off on CPUs


@pytest.mark.parametrize("overrides", ["", "train.grad_accum_steps=2",
                                       "runtime.mixed_precision=mixed_float16"])
def test_the_train_step_is_traced_once(digits_dir, overrides):
    """The optimizer's slots and the metrics' variables exist before the first step: created
    by it instead, its tf.function traces twice (seconds on a large model)."""
    from tftrain.data import reader
    from tftrain.engine import backend_choice, prepare

    config = _config(digits_dir, overrides)
    try:
        run = prepare.prepare(config, backend_choice.create(config), convert_data=False)
        batch = next(iter(reader.load(digits_dir, "train", 8 * config.train.grad_accum_steps,
                                      training=False)))
        run.trainer.train_on_batch(*batch)
        run.trainer.train_on_batch(*batch)
        assert run.trainer.train_function.experimental_get_tracing_count() == 1
        assert [m.name for m in run.trainer.metrics] == ["loss", "accuracy", "top5_accuracy"]
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_async_backup_is_on_for_one_process_runs_and_refused_where_it_cannot_be():
    """train.async_backup=auto writes in the background in one process (one device, Mirrored,
    pipeline) and not in a multi-worker or DTensor run, where `true` is refused in one line."""
    from types import SimpleNamespace

    from tftrain.engine.train import backs_up_in_background

    def setting(value):
        return config_lib.build_config("digits", overrides=f"train.async_backup={value}").train

    one, mirrored = (SimpleNamespace(name=n, num_workers=1) for n in ("one_device", "mirrored"))
    workers = SimpleNamespace(name="multi_worker_mirrored", num_workers=2)
    mesh = SimpleNamespace(name="dtensor", num_workers=1)
    assert backs_up_in_background(setting("auto"), one)
    assert backs_up_in_background(setting("true"), mirrored)
    assert not backs_up_in_background(setting("false"), one)
    assert not backs_up_in_background(setting("auto"), workers)
    assert not backs_up_in_background(setting("auto"), mesh)
    for backend in (workers, mesh):
        with pytest.raises(ConfigError, match=r"train.async_backup=true: a \w+ run"):
            backs_up_in_background(setting("true"), backend)
    with pytest.raises(ConfigError, match="train.async_backup='maybe' is not one of auto"):
        setting("maybe")


def test_the_models_object_graph_does_not_change_while_backups_are_written(
        tmp_path, digits_dir, monkeypatch):
    """A background write walks the model's object graph while training goes on: it must hold
    the same objects from the first backup to the end of training (the first validation made
    the model's test function, a new node, and broke a write in flight at 300M parameters)."""
    counts = []

    class CountObjects(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if not counts:  # the first step's backup is written
                counts.append(len(tf.train.TrackableView(self.model).descendants()))

        def on_train_end(self, logs=None):
            counts.append(len(tf.train.TrackableView(self.model).descendants()))

    make_callbacks = train.make_callbacks
    monkeypatch.setattr(train, "make_callbacks",
                        lambda *a, **k: make_callbacks(*a, **k) + [CountObjects()])
    summary = train.train(_config(digits_dir, "train.backup_every_steps=1"), str(tmp_path / "r"))
    assert summary["backup"]["async"] and summary["backup"]["count"] >= 12, summary["backup"]
    assert len(counts) == 2 and counts[0] == counts[1], counts

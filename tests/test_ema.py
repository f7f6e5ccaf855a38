"""train.ema_decay: the optimizer's moving average of the weights (`training.ema`).

The average after N deterministic SGD steps equals one computed independently (numpy) from the
weights of each step, with Model Garden's warm-up; Mirrored (the test process's 2 virtual CPUs),
pipeline stages (on them too) and a DTensor mesh (a forked process with 4) keep the average one
device keeps, each average placed (mirrored, on its stage's device, sharded) like its weight.
A run through the CLI validates, checkpoints, tests and exports the average, which `evaluate`,
`quantize` and `prune` then start from; `tftrain check` plans its bytes.
"""
import json
import os

import numpy as np
import pytest

from tests import documented, dtensor_forked
from tests.conftest import REPO

DECAY = 0.5  # (1 + t) / (10 + t) reaches 0.5 at t = 8: STEPS covers the warm-up and after it
STEPS = 12
BATCH = 32
DEVICES = ["/device:CPU:0", "/device:CPU:1"]


def _mlp():
    import tf_keras as keras

    from tftrain import models

    keras.utils.set_random_seed(0)
    return models.build_model("mlp", {"dropout": 0}, (8, 8, 1), 10)


def _optimizer(**changes):
    from tftrain import config_schema
    from tftrain.training import optimizers

    train = config_schema.TrainConfig(optimizer="sgd", learning_rate=0.1, momentum=0.9,
                                      ema_decay=DECAY, **changes)
    return optimizers.make_optimizer(train, STEPS, STEPS)


def _batches():
    rng = np.random.default_rng(7)
    return [(rng.normal(size=(BATCH, 8, 8, 1)).astype("float32"), rng.integers(0, 10, BATCH))
            for _ in range(STEPS)]


def _fit(trainer, record=None) -> None:
    """STEPS steps of `fit` on `_batches` (the call that ends in `finalize_variable_values`)."""
    import tensorflow as tf
    import tf_keras as keras

    xs, ys = (np.concatenate(part) for part in zip(*_batches()))
    data = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(BATCH)
    with trainer.distribute_strategy.scope():  # as the run makes it (backends.build)
        optimizer = _optimizer()
    trainer.compile(optimizer=optimizer,
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer.fit(data, epochs=1, verbose=0, callbacks=[record] if record else [])


def test_the_average_is_the_warmed_up_ema_of_each_steps_weights():
    """One device: the average of numpy over the weights recorded after each step (starting
    from the initial weights); after `fit` the model keeps its training weights, and `swap`
    exchanges them with the average."""
    import tf_keras as keras

    from tftrain.training import ema

    model = _mlp()
    steps = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            steps.append([v.numpy().astype(np.float64) for v in model.trainable_variables])

    average = [v.numpy().astype(np.float64) for v in model.trainable_variables]
    _fit(model, Record())
    assert len(steps) == STEPS
    for t, weights in enumerate(steps, start=1):
        decay = min(DECAY, (1 + t) / (10 + t))
        average = [decay * a + (1 - decay) * w for a, w in zip(average, weights)]
    optimizer = ema.optimizer_of(model)
    kept = [v.numpy() for v in ema.averages(optimizer)]
    assert [v.ref() for v in optimizer.averaged] == [v.ref() for v in model.trainable_variables]
    for got, want in zip(kept, average):
        np.testing.assert_allclose(got, want, atol=1e-6)
    # the average is not the last weights (nor the first): it trained and it lags
    assert min(float(np.abs(a - w).max()) for a, w in zip(average, steps[-1])) > 1e-3
    # fit did not overwrite the weights with the average (tf-keras's finalize_variable_values)
    for variable, last in zip(model.trainable_variables, steps[-1]):
        np.testing.assert_array_equal(variable.numpy(), last.astype(np.float32))
    ema.swap(optimizer)
    for variable, average_, weights in zip(model.trainable_variables, ema.averages(optimizer),
                                           zip(kept, steps[-1])):
        np.testing.assert_array_equal(variable.numpy(), weights[0])
        np.testing.assert_array_equal(average_.numpy(), weights[1].astype(np.float32))


def _one_device_average() -> list:
    """The average one device keeps after `_fit` (the model's weights after `swap`)."""
    from tftrain.training import ema

    model = _mlp()
    _fit(model)
    ema.swap(ema.optimizer_of(model))
    return model.get_weights()


def test_mirrored_keeps_one_devices_average_mirrored_like_its_weight():
    import tensorflow as tf

    from tftrain import config as config_lib
    from tftrain.runtime import distribute
    from tftrain.training import ema

    reference = _one_device_average()
    # as a run makes it (on CPUs: reduced on one device, no collective ops)
    strategy = distribute.create_strategy(config_lib.RuntimeConfig(strategy="mirrored",
                                                                   cpu_devices=2))
    with strategy.scope():
        model = _mlp()
    _fit(model)  # the global batch split over the 2 replicas
    optimizer = ema.optimizer_of(model)
    for weight, average in zip(optimizer.averaged, ema.averages(optimizer)):
        assert isinstance(average, tf.distribute.DistributedValues), average
        assert ([c.device for c in average.values] == [c.device for c in weight.values]
                and len(average.values) == 2), (average, weight)
    ema.swap(optimizer)
    differences = [float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), reference)]
    assert max(differences) < 1e-5, differences
    # every replica's copy holds the average (swap wrote them all)
    for weight in optimizer.averaged:
        np.testing.assert_array_equal(weight.values[0].numpy(), weight.values[1].numpy())


def test_pipeline_stages_keep_one_devices_average_on_each_stages_device():
    from tests.test_pipeline import gathered, twin
    from tftrain.runtime import pipeline_model, pipeline_stages
    from tftrain.training import ema

    reference = _one_device_average()
    model = _mlp()
    stages = pipeline_stages.build(model, pipeline_stages.plan(model, 2), DEVICES)
    trainer = pipeline_model.PipelineModel(stages, DEVICES, microbatches=2)
    _fit(trainer)
    optimizer = ema.optimizer_of(trainer)
    placed = {(weight.device, average.device) for weight, average in
              zip(optimizer.averaged, ema.averages(optimizer))}
    assert {w for w, _ in placed} == {a for _, a in placed} and all(
        w == a for w, a in placed) and len(placed) == 2, placed
    ema.swap(optimizer)
    differences = [float(np.abs(a - b).max()) for a, b in
                   zip(gathered(model, stages).get_weights(), reference)]
    assert max(differences) < 1e-5, differences
    assert max(float(np.abs(a - b).max()) for a, b in
               zip(twin(model).get_weights(), reference)) > 1e-3  # the stages trained


# --- On a batch:2,model:2 mesh of virtual CPU devices (a forked process) ----------------------

MESH_AVERAGE = r'''
import json, sys
import tftrain  # noqa: F401
from tftrain import config as config_lib, models
from tftrain.training import ema, optimizers, steps
from tftrain.runtime import dtensor as dtensor_runtime, dtensor_layouts
from tftrain.engine import run_memory

data, decay, count = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
configs = {name: config_lib.build_config("digits_dtensor", {}, (
               f"train.optimizer=sgd,train.learning_rate=0.1,train.momentum=0.9,"
               f"train.lr_schedule=constant,train.ema_decay={decay},"
               f"runtime.shard_optimizer_state={shard}"))
           for name, shard in (("plain", "false"), ("sharded_state", "true"))}
mesh, dims = dtensor_runtime.create_mesh(configs["plain"].runtime)
import numpy as np, tensorflow as tf, tf_keras as keras
from tensorflow.experimental import dtensor

keras.backend.experimental.enable_tf_random_generator()
arrays = np.load(data)
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
results = {}
for name, config in configs.items():
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model = models.build_model("mlp", {"dropout": 0}, (8, 8, 1), 10)
    plan = dtensor_runtime.resolve_layouts(model, "mlp", {}, dims)
    sharded = dtensor_runtime.build_sharded(model, mesh, plan)
    dataset = dtensor.DTensorDataset(
        tf.data.Dataset.from_tensor_slices((arrays["x"], arrays["y"])).repeat(), mesh=mesh,
        global_batch_size=32, batch_dim="batch",
        layouts=(dtensor.Layout.batch_sharded(mesh, "batch", 4),
                 dtensor.Layout.batch_sharded(mesh, "batch", 1)))
    optimizer = dtensor_runtime.make_optimizer(config.train, steps.StepPlan(count, 1, count),
                                               mesh, config.runtime.shard_optimizer_state)
    sharded.compile(optimizer=optimizer, loss=loss)
    sharded.fit(dataset, epochs=1, steps_per_epoch=count, verbose=0)
    layouts = [[list(dtensor.fetch_layout(v).sharding_specs) for v in pair] for pair in
               zip(optimizer.averaged, ema.averages(optimizer))]
    ema.swap(optimizer)
    averaged = dtensor_runtime.named_variables(sharded)
    report = dtensor_layouts.memory_report(dtensor_runtime.weights_of(model), plan, dims, "sgd",
                                           config.runtime.shard_optimizer_state, ema=True)
    results[name] = {
        "average": {p: dtensor_runtime.gather(averaged[p]).numpy().tolist()
                    for p in dtensor_runtime.named_variables(model)},
        "layouts": layouts, "report": report, "measured": run_memory.measure(sharded, optimizer)}
print("RESULT " + json.dumps(results))
'''


def test_dtensor_keeps_one_devices_average_sharded_like_its_weight(tmp_path):
    """The single-write DTensor SGD (whole slots, and slots split over `batch`): the average
    equals one device's, each average has its weight's layout (never split over `batch`), and
    the memory report counts it as the run holds it."""
    from tftrain.runtime import dtensor as dtensor_runtime
    from tftrain.training import ema

    model = _mlp()
    _fit(model)
    ema.swap(ema.optimizer_of(model))
    # in the order of their paths (the layers' names here depend on the models built before)
    reference = [v.numpy() for v in dtensor_runtime.named_variables(model).values()]
    xs, ys = (np.concatenate(part) for part in zip(*_batches()))
    np.savez(tmp_path / "batches.npz", x=xs, y=ys)
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    args = [tmp_path / "batches.npz", str(DECAY), str(STEPS)]
    out = dtensor_forked.run_script(MESH_AVERAGE, args, cwd=REPO, env=env, timeout=600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    for name, result in json.loads(lines[0][len("RESULT "):]).items():
        differences = {p: float(np.abs(np.array(v) - want).max())
                       for (p, v), want in zip(result["average"].items(), reference)}
        assert len(differences) == len(reference) == 6 and max(differences.values()) < 1e-5, (
            name, differences)
        assert all(weight == average for weight, average in result["layouts"]), result["layouts"]
        assert any("model" in weight for weight, _ in result["layouts"]), result["layouts"]
        for key in ("optimizer_bytes_per_device", "weights_bytes_per_device"):
            assert result["report"][key] == result["measured"][key], (name, key, result)


# --- Through the CLI, as a user runs it ------------------------------------------------------

RUN_DECAY = 0.99  # docs/training.md's


@pytest.mark.parametrize("value", ["1", "-0.1", "nan"])
def test_a_decay_out_of_range_is_one_line(cli, capsys, tmp_path, value):
    assert cli("train", "--config=digits", f"--model_dir={tmp_path / 'run'}",
               f"--params_override=train.ema_decay={value}") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"train.ema_decay={float(value)} must be in [0, 1)" in err, err
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def averaged_run(tmp_path_factory, digits_dir):
    """docs/training.md's `tftrain train`, for one epoch (44 steps, at a rate of 0.005), on the session's
    digits: its final weights dumped (TFTRAIN_DUMP_WEIGHTS_DIR: the average, then the training
    weights)."""
    from tests.conftest import run_cli

    root = tmp_path_factory.mktemp("ema")
    overrides = (f"train.ema_decay={RUN_DECAY},data.dir={digits_dir},train.epochs=1,"
                 "train.learning_rate=0.005")
    os.environ["TFTRAIN_DUMP_WEIGHTS_DIR"] = str(root / "weights")
    try:
        assert run_cli(*documented.replaced(documented.args(
            "tftrain train --config=digits --model_dir=runs/ema "
            "--params_override=train.ema_decay=0.99"),
            model_dir=root / "run", params_override=overrides)) == 0
    finally:
        del os.environ["TFTRAIN_DUMP_WEIGHTS_DIR"]
    with np.load(root / "weights" / "worker-0.npz") as npz:
        dumped = [npz[key] for key in npz.files]
    return root / "run", overrides, dumped


def test_a_run_validates_tests_and_exports_the_average(averaged_run, digits_dir, cli):
    import tf_keras as keras

    from tftrain.data import reader
    from tftrain.engine.export import saved_model_dir
    from tftrain.optimize import evaluate

    run, _, dumped = averaged_run
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ema"] == {"decay": RUN_DECAY, "evaluated": True}
    exported = keras.models.load_model(saved_model_dir(str(run / "export")), compile=False)
    weights = exported.get_weights()
    average, training = dumped[:len(weights)], dumped[len(weights):]
    assert len(training) == len(exported.trainable_weights)  # the averages held them at the end
    for got, want in zip(weights, average):
        np.testing.assert_array_equal(got, want)
    assert max(float(np.abs(w.numpy() - t).max()) for w, t in zip(
        exported.trainable_weights, training)) > 1e-3, "the average is the training weights"
    # `evaluate` on the export (docs/training.md's command) reproduces the test metrics, and
    # fit's last validation (the one epoch's end: the same average), which the training
    # weights do not
    assert cli(*documented.replaced(documented.args(
        "tftrain evaluate --model=runs/ema/export --data=data/digits --split=test"),
        model=run / "export", data=digits_dir)) == 0
    test = json.loads((run / "eval_test.json").read_text())
    validation = evaluate.evaluate(str(run / "export"), digits_dir, "validation")
    for split, metrics, recorded in (("test", test, summary["eval"]),
                                     ("validation", validation, summary["validation"])):
        assert abs(metrics["loss"] - recorded["loss"]) < 1e-5, (split, metrics, recorded)
        assert abs(metrics["accuracy"] - recorded["accuracy"]) < 1e-6, (split, metrics, recorded)
    for variable, value in zip(exported.trainable_weights, training):
        variable.assign(value)
    exported.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    training_loss = exported.evaluate(reader.load(digits_dir, "test", 32, training=False),
                                      verbose=0)
    assert abs(training_loss - summary["eval"]["loss"]) > 1e-3
    # the best checkpoint (the one epoch's) holds the average as the model's weights
    exported.set_weights([np.zeros_like(w) for w in weights])
    exported.load_weights(str(run / "checkpoints" / "best")).expect_partial()
    for got, want in zip(exported.get_weights(), average):
        np.testing.assert_array_equal(got, want)


def test_quantize_and_prune_start_from_the_average(averaged_run):
    """Their float baseline is the export's: the average (its test loss, which the training
    weights miss by more than 1e-3: the test above)."""
    from tests.conftest import run_cli

    run, _, _ = averaged_run
    summary = json.loads((run / "summary.json").read_text())
    assert run_cli("quantize", f"--model_dir={run}", "--mode=dynamic") == 0
    report = json.loads((run / "quantized" / "report.json").read_text())
    assert abs(report["float_metrics"]["loss"] - summary["eval"]["loss"]) < 1e-4, report
    assert run_cli("prune", f"--model_dir={run}", "--epochs=1", "--target_sparsity=0.5") == 0
    report = json.loads((run / "pruned" / "report.json").read_text())
    assert abs(report["metrics_before"]["loss"] - summary["eval"]["loss"]) < 1e-5, report


def test_check_plans_the_averages_bytes(averaged_run, cli, tmp_path):
    run, overrides, _ = averaged_run
    measured = json.loads((run / "summary.json").read_text())["memory"]
    path = tmp_path / "plan.json"
    assert cli("check", "--config=digits", "--target=cpu", f"--params_override={overrides}",
               f"--json={path}") == 0
    planned = json.loads(path.read_text())["memory"]["parts"]
    # Adam's two moments and the average: three weight-sized slots
    assert planned["optimizer_state"] == measured["optimizer_bytes_per_device"] == (
        3 * measured["weights_bytes_per_device"])

"""Optimizer state for big models: tftrain's Adafactor (factored second moments only) and
DTensor's optimizer slots sharded over the mesh's batch dimension (ZeRO-1)."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tests import dtensor_forked
from tests.conftest import REPO
from tests.dtensor_runs import dtensor_adafactor_run  # noqa: F401  (a fixture)
from tftrain.training import optimizers

TIMEOUT = 600


def _model(seed: int = 0) -> keras.Model:
    """Weights of rank 1, 2 and 3 (an EinsumDense kernel [8, 2, 4]), and an embedding."""
    keras.utils.set_random_seed(seed)
    ids = keras.Input(shape=(5,), dtype="int32")
    x = keras.layers.Embedding(20, 8)(ids)
    x = keras.layers.EinsumDense("btd,dhk->bthk", output_shape=(5, 2, 4), bias_axes="hk")(x)
    x = keras.layers.Flatten()(x)
    return keras.Model(ids, keras.layers.Dense(3)(x))


def _train(optimizer, steps: int = 5) -> list:
    model = _model()
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(1)
    for _ in range(steps):
        model.train_on_batch(rng.integers(0, 20, (16, 5)), rng.integers(0, 3, (16,)))
    return model.get_weights()


@pytest.mark.parametrize("rate", [0.01, "schedule"])
def test_adafactor_steps_as_tf_keras_adafactor_does(rate):
    def rate_of():
        return keras.optimizers.schedules.CosineDecay(0.05, 10) if rate == "schedule" else rate

    ours = _train(optimizers.Adafactor(rate_of()))
    theirs = _train(keras.optimizers.Adafactor(rate_of()))
    moved = _model().get_weights()
    assert any(np.abs(a - b).max() > 1e-3 for a, b in zip(ours, moved))
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_adafactor_stays_finite_where_tf_keras_adafactor_turns_nan():
    """A weight row whose gradient is always zero (an input that is always 0, like digits's
    blank border pixels): tf-keras's full-size estimate underflows to 0 there and 0 * inf
    makes its update NaN; tftrain's multiplies the row and column factors' rsqrt instead."""
    def train(optimizer):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.layers.Dense(16, activation="relu", input_shape=(6,)),
                                  keras.layers.Dense(3)])
        model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        rng = np.random.default_rng(0)
        x = rng.uniform(0, 16, (32, 6)).astype("float32")
        x[:, 0] = 0.0  # an input that never varies: its kernel row gets no gradient
        for _ in range(3):
            model.train_on_batch(x, rng.integers(0, 3, (32,)))
        return model.get_weights()

    assert np.isnan(train(keras.optimizers.Adafactor(0.01))[0]).any()
    assert all(np.isfinite(w).all() for w in train(optimizers.Adafactor(0.01)))


def test_adafactor_keeps_factored_moments_only():
    model = _model()
    optimizer = optimizers.Adafactor(0.01)
    model.compile(optimizer, "mse")
    optimizer.build(model.trainable_variables)
    kept = sorted(tuple(v.shape) for v in optimizer.variables if v is not optimizer.iterations)
    expected = sorted(s for w in model.trainable_variables
                      for s in optimizers.slot_shapes("adafactor", w.shape))
    assert kept == expected
    # embedding [20, 8]: 20 + 8; einsum kernel [8, 2, 4]: [8, 2] + [8, 4]; its bias [2, 4]: 2 + 4;
    # dense kernel [40, 3]: 40 + 3; dense bias [3]: 3 (a vector keeps its full second moment)
    assert sum(int(np.prod(s)) for s in kept) == 28 + 48 + 6 + 43 + 3
    tf_keras_state = keras.optimizers.Adafactor(0.01)
    tf_keras_state.build(model.trainable_variables)
    params = sum(int(np.prod(w.shape)) for w in model.trainable_variables)
    theirs = sum(int(np.prod(v.shape)) for v in tf_keras_state.variables[1:])
    assert theirs > params  # a full copy and more: what tftrain's Adafactor does not keep


# --- On a batch:2,model:2 mesh of virtual CPU devices (a forked process) --------------------------

MESH_STEPS = r'''
import json, sys
import tftrain  # noqa: F401
from tftrain import config as config_lib, models
from tftrain.training import optimizers, steps
from tftrain.runtime import dtensor as dtensor_runtime, dtensor_layouts
from tftrain.engine import run_memory
from tftrain.data import reader

data_dir, runs = sys.argv[1], json.loads(sys.argv[2])
configs = [config_lib.build_config("digits_dtensor", {}, f"data.dir={data_dir},train.steps=3,"
                                   "train.lr_schedule=constant," + overrides)
           for overrides in runs]
mesh, dims = dtensor_runtime.create_mesh(configs[0].runtime)  # every run's: batch:2,model:2
import numpy as np, tensorflow as tf, tf_keras as keras
from tensorflow.experimental import dtensor

keras.backend.experimental.enable_tf_random_generator()
x, y = next(iter(reader.load(data_dir, "train", 32, training=False)))
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
results = {}
# The three steps on one device are taken once per optimizer and compared with each of its
# mesh runs: every run starts from the same seeded weights (checked) on the same batch.
one_device = {}
for overrides, config in zip(runs, configs):
    assert config.runtime.mesh == configs[0].runtime.mesh, overrides
    keras.backend.clear_session()  # each run's layers named as in a process of its own
    keras.utils.set_random_seed(0)
    model = models.build_model("mlp", {"dropout": 0}, (8, 8, 1), 10)
    initial = [w.numpy() for w in model.weights]
    reference = one_device.get(config.train.optimizer)
    if reference is not None:
        assert len(initial) == len(reference["initial"]) and all(
            np.array_equal(a, b) for a, b in zip(initial, reference["initial"])), overrides
    plan = dtensor_runtime.resolve_layouts(model, "mlp", {}, dims)
    sharded = dtensor_runtime.build_sharded(model, mesh, plan)
    dataset = dtensor.DTensorDataset(
        tf.data.Dataset.from_tensor_slices((x, y)).repeat(), mesh=mesh, global_batch_size=32,
        batch_dim="batch", layouts=(dtensor.Layout.batch_sharded(mesh, "batch", 4),
                                    dtensor.Layout.batch_sharded(mesh, "batch", 1)))
    optimizer = dtensor_runtime.make_optimizer(config.train, steps.StepPlan(3, 1, 3), mesh,
                                               shard_state=config.runtime.shard_optimizer_state)
    sharded.compile(optimizer=optimizer, loss=loss)
    sharded.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0)
    if reference is None:
        model.compile(optimizer=optimizers.make_optimizer(config.train, 3, 3), loss=loss)
        for _ in range(3):
            model.train_on_batch(x, y)  # the same steps on one device
        reference = one_device[config.train.optimizer] = {
            "initial": initial, "trained": {p: v.numpy() for p, v in
                                            dtensor_runtime.named_variables(model).items()}}
    mesh_weights = dtensor_runtime.named_variables(sharded)
    diffs = {p: float(np.abs(dtensor_runtime.gather(mesh_weights[p]).numpy() - v).max())
             for p, v in reference["trained"].items()}
    slots = {v.name: dtensor.fetch_layout(v).sharding_specs
             for v in run_memory.optimizer_state(optimizer)}
    report = dtensor_layouts.memory_report(dtensor_runtime.weights_of(model), plan, dims,
                                           config.train.optimizer,
                                           config.runtime.shard_optimizer_state)
    results[overrides] = {"diffs": diffs, "slots": slots, "report": report,
                          "measured": run_memory.measure(sharded, optimizer)}
print("RESULT " + json.dumps(results))
'''

OPTIMIZERS = ["adafactor", "adam"]  # sgd: one slot, as adam's m


def _runs(optimizer: str) -> tuple:
    """The overrides of the plain and the sharded-state run of `optimizer`."""
    return (f"train.optimizer={optimizer}",
            f"train.optimizer={optimizer},runtime.shard_optimizer_state=true")


@pytest.fixture(scope="module")
def mesh_steps(digits_dir) -> dict:
    """{overrides: what MESH_STEPS measured} for every run of OPTIMIZERS, all in one forked
    process (one mesh, one set of virtual devices): each run builds its model from seed 0,
    on the same batch, as a process of its own would."""
    runs = [overrides for optimizer in OPTIMIZERS for overrides in _runs(optimizer)]
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = dtensor_forked.run_script(MESH_STEPS, [digits_dir, json.dumps(runs)], env=env,
                                    cwd=REPO, timeout=TIMEOUT)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    results = json.loads(lines[0][len("RESULT "):])
    assert sorted(results) == sorted(runs), results.keys()
    return results


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_sharded_optimizer_state_steps_as_one_device_does(mesh_steps, optimizer):
    plain, sharded = (mesh_steps[overrides] for overrides in _runs(optimizer))
    # Three steps on the mesh (slots whole per replica, or split over batch) = on one device.
    assert max(plain["diffs"].values()) < 1e-5, plain["diffs"]
    assert max(sharded["diffs"].values()) < 1e-5, sharded["diffs"]
    # The slots really are split over `batch` (and `model` as their weight is) ...
    assert all("batch" not in spec for spec in plain["slots"].values()), plain["slots"]
    # (a kernel's slots all are; a bias split over `model` has no dimension left for `batch`)
    kernels = {name: spec for name, spec in sharded["slots"].items() if "kernel" in name}
    assert kernels and all("batch" in spec for spec in kernels.values()), sharded["slots"]
    # ... so the state per device falls, and the report counts what the devices hold.
    for result in (plain, sharded):
        assert (result["report"]["optimizer_bytes_per_device"]
                == result["measured"]["optimizer_bytes_per_device"]), result
        assert (result["report"]["weights_bytes_per_device"]
                == result["measured"]["weights_bytes_per_device"]), result
    assert (sharded["measured"]["optimizer_bytes_per_device"]
            < 0.6 * plain["measured"]["optimizer_bytes_per_device"])


# --- Through the CLI, as a user runs it -----------------------------------------------------

def _expected_state_bytes(run, optimizer: str) -> int:
    from tftrain.engine.export import saved_model_dir

    model = keras.models.load_model(saved_model_dir(str(run / "export")), compile=False)
    return sum(4 * int(np.prod(shape)) for w in model.trainable_weights
               for shape in optimizers.slot_shapes(optimizer, w.shape))


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_adafactor_trains_through_the_cli(cli, tmp_path, digits_dir, strategy):
    run = tmp_path / "run"
    devices = ",runtime.cpu_devices=2" if strategy == "mirrored" else ""
    assert cli("train", f"--model_dir={run}", f"--strategy={strategy}",
               f"--params_override=data.dir={digits_dir},train.optimizer=adafactor,"
               f"train.learning_rate=0.01,train.epochs=2{devices}") == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["strategy"] == strategy and summary["eval"]["accuracy"] > 0.8, summary
    assert summary["memory"]["optimizer_bytes_per_device"] == _expected_state_bytes(
        run, "adafactor")
    assert summary["memory"]["optimizer_bytes_per_device"] < (
        0.1 * summary["memory"]["weights_bytes_per_device"])  # Adam's would be 2x


def test_dtensor_adafactor_with_sharded_state_resumes_through_the_cli(dtensor_adafactor_run):
    """SIGTERM after the first backup, then the same command (the shared run's build, asserting
    exit 143 and then 0): the batch-split slots are saved and restored as they are, and the run
    finishes."""
    run = dtensor_adafactor_run
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"] and summary["eval"]["accuracy"] > 0.8, summary
    planned, measured = summary["dtensor"]["memory"], summary["memory"]
    assert planned["shard_optimizer_state"] and planned["optimizer"] == "adafactor"
    assert planned["optimizer_bytes_per_device"] == measured["optimizer_bytes_per_device"]
    assert planned["weights_bytes_per_device"] == measured["weights_bytes_per_device"]
    assert measured["optimizer_bytes_per_device"] < 0.6 * _expected_state_bytes(run, "adafactor")

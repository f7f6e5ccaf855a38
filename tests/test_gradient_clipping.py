"""`train.clip_global_norm` and the gradient norm every run measures (`training.gradients`).

The norm is the whole model's: recomputed here from the one-device gradient, it is what the
optimizer records on one device, under Mirrored over the 2 virtual CPUs of this process (the
all-reduced gradient: clipping each replica's own would give another update, checked), with
gradient accumulation (once per update), on pipeline stages with 2 replicas (each stage's
gradient counted once, not once per copy) and on a DTensor `batch:2,model:2` mesh (4 devices,
in a forked process). Deterministic SGD at a rate and clip where every step is clipped: the
weights equal one device's within 1e-5. Under `mixed_float16` the clipped update equals
float32's (the loss scale is out of the norm).
"""
import json
import os

import numpy as np
import pytest

from tests import dtensor_forked
from tests.conftest import REPO
from tests.test_pipeline import lm, lm_batch, max_difference, pipelined, twin
from tftrain.errors import ConfigError

CLIP = 0.5  # the transformer_lm below starts near 2.7 and stays above 1 in 3 steps
RATE = 0.5
STEPS = 3


def _train_config(**changes):
    from tftrain import config as config_lib

    values = {"optimizer": "sgd", "momentum": 0.0, "learning_rate": RATE,
              "clip_global_norm": CLIP, **changes}
    return config_lib.TrainConfig(**values)


def _optimizer(**changes):
    from tftrain.training import optimizers

    return optimizers.make_optimizer(_train_config(**changes), 10, 10)


def _compiled(model, optimizer):
    import tf_keras as keras

    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _by_hand(model, batches, clip=CLIP, rate=RATE):
    """Plain SGD on a twin of `model`, each step's gradient (of the whole batch) clipped to
    `clip`: the weights after all steps and each step's global norm."""
    import tensorflow as tf
    import tf_keras as keras

    copy = twin(model)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    norms = []
    for x, y in batches:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, copy(x, training=True))
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, copy.trainable_variables)]
        norm = float(np.sqrt(sum(float(np.sum(np.square(g.numpy()))) for g in grads)))
        norms.append(norm)
        scale = min(1.0, clip / norm) if clip else 1.0
        for variable, g in zip(copy.trainable_variables, grads):
            variable.assign_sub(rate * scale * g)
    return copy, norms


def _recorded(optimizer):
    from tftrain.training import gradients

    return gradients.summary(optimizer)


@pytest.fixture(scope="module")
def one_device():
    """The transformer_lm (an embedding: sparse gradients with repeated rows) trained 3
    clipped steps on one device, and the same steps by hand."""
    import tf_keras as keras

    keras.utils.set_random_seed(0)
    model = lm(num_layers=1)
    batches = [lm_batch(seed=step) for step in range(STEPS)]
    trained = _compiled(twin(model), _optimizer())
    norms = []
    for x, y in batches:
        trained.train_on_batch(x, y)
        norms.append(float(trained.optimizer.gradient_norm.numpy()))
    by_hand, expected = _by_hand(model, batches)
    return model, batches, trained, norms, by_hand, expected


def test_one_device_records_the_norm_and_clips_to_it(one_device):
    model, _, trained, norms, by_hand, expected = one_device
    assert norms == pytest.approx(expected, rel=1e-5)
    assert min(expected) > CLIP  # every step was clipped
    assert max_difference(trained, by_hand) < 1e-5
    assert max_difference(trained, model) > 1e-3  # it did train
    assert _recorded(trained.optimizer) == {
        "clip_global_norm": CLIP, "last_norm": pytest.approx(expected[-1], rel=1e-5),
        "max_norm": pytest.approx(max(expected), rel=1e-5), "clipped_steps": STEPS,
        "clipped_fraction": 1.0}


def test_mirrored_clips_the_all_reduced_gradient(one_device):
    """2 replicas, each with half of every batch: the norm of the mean gradient is clipped,
    so the weights are one device's. Clipping each replica's half-batch gradient before the
    all-reduce (what the test could not tell apart if every half had the same norm) moves the
    weights elsewhere: the first step's shows by how much."""
    from tftrain import config as config_lib
    from tftrain.runtime import distribute

    model, batches, trained, norms, _, _ = one_device
    # as a run makes it (on CPUs: reduced on one device, no collective ops)
    strategy = distribute.create_strategy(config_lib.RuntimeConfig(strategy="mirrored",
                                                                   cpu_devices=2))
    with strategy.scope():
        mirrored = _compiled(twin(model), _optimizer())
    mirrored_norms = []
    for x, y in batches:
        mirrored.train_on_batch(x, y)
        mirrored_norms.append(float(mirrored.optimizer.gradient_norm.numpy()))
    assert mirrored_norms == pytest.approx(norms, rel=1e-5)
    assert max_difference(mirrored, trained) < 1e-5
    assert _recorded(mirrored.optimizer)["clipped_steps"] == STEPS

    x, y = batches[0]
    first_step, _ = _by_hand(model, [(x, y)])
    each_half = [_by_hand(model, [(x[:4], y[:4])])[0], _by_hand(model, [(x[4:], y[4:])])[0]]
    per_replica = [(a + b) / 2 for a, b in zip(*(half.get_weights() for half in each_half))]
    assert max(float(np.abs(a - b).max())
               for a, b in zip(per_replica, first_step.get_weights())) > 1e-3


def test_gradient_accumulation_clips_each_update_once(one_device):
    """2 micro-batches of 4 per update: the accumulated mean is what is measured and clipped,
    so the weights are those of one device on the whole batch (a norm per micro-batch would
    be measured twice per update and clip each half)."""
    from tftrain.engine import grad_accum

    model, batches, trained, norms, _, _ = one_device
    accumulating = grad_accum.wrap(twin(model), 2)
    _compiled(accumulating, _optimizer())
    for x, y in batches:
        accumulating.train_on_batch(x, y)
    assert max_difference(accumulating.inner, trained) < 1e-5
    summary = _recorded(accumulating.optimizer)
    assert summary["clipped_steps"] == STEPS
    assert summary["last_norm"] == pytest.approx(norms[-1], rel=1e-5)


def test_pipeline_stages_with_replicas_count_each_gradient_once(one_device):
    """2 stages x 2 replicas (each stage's gradient applied to both copies): the norm is over
    every stage, each counted once (counted per copy it would be sqrt(2) x the model's)."""
    from tests.test_pipeline import gathered

    model, batches, trained, norms, _, _ = one_device
    _, copies, pipeline = pipelined(model, microbatches=2, replicas=2, optimizer=_optimizer())
    recorded = []
    for x, y in batches:
        pipeline.train_on_batch(x, y)
        recorded.append(float(pipeline.optimizer.gradient_norm.numpy()))
    assert recorded == pytest.approx(norms, rel=1e-5)
    for r in range(2):
        assert max_difference(gathered(model, pipeline.replica(r)[0]), trained) < 1e-5


@pytest.mark.parametrize("precision", ["mixed_float16"])
def test_mixed_float16_clips_the_unscaled_gradient_as_float32_does(one_device, precision):
    """The loss-scale optimizer scales the loss by 2^15: a norm measured before the scale is
    removed would be 32768 x the model's and clip every update to almost nothing."""
    import tf_keras as keras

    model, batches, trained, norms, _, _ = one_device
    keras.mixed_precision.set_global_policy(precision)
    try:
        half = twin(lm(num_layers=1))
        half.set_weights(model.get_weights())
        _compiled(half, keras.mixed_precision.LossScaleOptimizer(_optimizer()))
        recorded = []
        for x, y in batches:
            half.train_on_batch(x, y)
            recorded.append(float(half.optimizer.inner_optimizer.gradient_norm.numpy()))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert recorded == pytest.approx(norms, rel=2e-2)
    assert max_difference(half, trained) < 2e-3
    assert max_difference(half, model) > 1e-2  # the clipped steps moved it as float32's did


DTENSOR = dtensor_forked.MLP_ON_MESH + r'''
optimizer = dtensor_runtime.make_optimizer(config.train, steps.StepPlan(3, 1, 3), mesh)
sharded.compile(optimizer=optimizer, loss=loss)
model.compile(optimizer=optimizers.make_optimizer(config.train, 3, 3), loss=loss)
before = [w.copy() for w in model.get_weights()]
norms = []
for step in range(3):
    sharded.fit(dataset, epochs=1, steps_per_epoch=1, verbose=0)
    model.train_on_batch(x, y)
    norms.append([float(dtensor.unpack(optimizer.gradient_norm.read_value())[0].numpy()),
                  float(model.optimizer.gradient_norm.numpy())])
variables = dtensor_runtime.named_variables(sharded)
one = dtensor_runtime.named_variables(model)
diffs = {p: float(np.abs(dtensor_runtime.gather(v).numpy() - one[p].numpy()).max())
         for p, v in variables.items()}
moved = max(float(np.abs(a - b).max()) for a, b in zip(before, model.get_weights()))
print("RESULT " + json.dumps({
    "norms": norms, "diffs": diffs, "moved": moved,
    "sharded": [p for p, v in variables.items() if "model" in dtensor.fetch_layout(v).sharding_specs],
    "clipped": [int(dtensor.unpack(optimizer.clipped_updates.read_value())[0].numpy()),
                int(model.optimizer.clipped_updates.numpy())]}))
'''


def test_dtensor_mesh_clips_the_norm_over_every_shard(digits_dir):
    """The MLP's kernels split over `model:2`, the batch over `batch:2`: the norm summed over
    the shards and the replicas is one device's, and so are the clipped weights."""
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    overrides = (f"train.optimizer=sgd,train.momentum=0,train.learning_rate={RATE},"
                 f"train.clip_global_norm={CLIP}")
    out = dtensor_forked.run_script(DTENSOR, [digits_dir, overrides], env=env, cwd=REPO,
                                    timeout=600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    result = json.loads(lines[0][len("RESULT "):])
    assert len(result["sharded"]) >= 3, result["sharded"]
    for mesh_norm, one_norm in result["norms"]:
        assert mesh_norm == pytest.approx(one_norm, rel=1e-5) and one_norm > 0.5
    assert result["clipped"] == [3, 3]
    assert max(result["diffs"].values()) < 1e-5, result["diffs"]
    assert result["moved"] > 1e-3


def test_a_non_finite_norm_is_acted_on_by_the_guard_at_that_step(tmp_path):
    from tftrain.callbacks import backup as backup_lib
    from tftrain.callbacks.divergence import Diverged, DivergenceGuard

    guard = DivergenceGuard("stop", backup_lib.Backup(str(tmp_path / "backup"), 0))
    guard.set_params({"steps": 10})
    guard.on_train_batch_end(0, {"loss": 2.0, "grad_norm": 3.0})
    with pytest.raises(Diverged, match=r"the gradients' global norm is inf at epoch 1 step 2 "
                                       r"\(global step 2\); the last finite loss was 2 at "
                                       r"global step 1"):
        guard.on_train_batch_end(1, {"loss": 2.0, "grad_norm": float("inf")})


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_clip_out_of_range_is_one_line(value):
    from tftrain import config as config_lib

    with pytest.raises(ConfigError, match=r"^train.clip_global_norm must be a finite number "
                                          r">= 0 \(0: off\), got "):
        config_lib.build_config("digits", overrides=f"train.clip_global_norm={value}")

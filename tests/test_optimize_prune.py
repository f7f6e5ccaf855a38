"""Magnitude and 2:4 pruning (`tftrain.optimize.prune`) on a small digits CNN."""
import numpy as np
import pytest

from tests.test_optimize_models import (digits_eval, digits_train, steps_per_epoch,  # noqa: F401
                                        trained)
from tftrain.errors import ConfigError, TftrainError
from tftrain.optimize import metrics, prune, sizes


def _kernels(model):
    return {layer.name: layer.kernel.numpy() for layer in model.layers if hasattr(layer, "kernel")}


def test_target_sparsity_reached_per_layer_and_original_untouched(trained, digits_dir):
    original = [w.copy() for w in trained.get_weights()]
    result = prune.prune_model(trained, digits_train(digits_dir), epochs=2,
                               steps_per_epoch=steps_per_epoch(digits_dir), target_sparsity=0.8,
                               min_weights=0)
    for a, b in zip(original, trained.get_weights()):
        np.testing.assert_array_equal(a, b)

    # Measured on the stripped model's weights, layer by layer.
    kernels = _kernels(result.model)
    assert len(kernels) == 4
    for name, kernel in kernels.items():
        assert abs((kernel == 0).mean() - 0.8) < 0.01, name
    report = prune.sparsity_report(result.model, result.pruned_weights)
    assert abs(report["sparsity"] - 0.8) < 0.01
    assert all(abs(layer["sparsity"] - 0.8) < 0.01 for layer in report["layers"])
    assert report["nonzero_params"] < 0.3 * report["num_params"]
    assert prune.check_sparsity_reached(report, 0.8) == []
    assert not any(type(l).__name__ == "PruneLowMagnitude" for l in result.model.layers)

    assert sizes.gzip_weights_bytes(result.model) < 0.45 * sizes.gzip_weights_bytes(trained)
    accuracy_after = metrics.keras_accuracy(result.model, digits_eval(digits_dir))
    assert accuracy_after > 0.75  # a tiny model at 80% sparsity after 2 epochs; chance is 0.1


def test_small_layers_stay_dense_by_default(trained, digits_dir):
    small = [l.name for l in trained.layers if 0 < prune.kernel_weights(l) < prune.DEFAULT_MIN_WEIGHTS]
    large = [l.name for l in trained.layers if prune.kernel_weights(l) >= prune.DEFAULT_MIN_WEIGHTS]
    assert small and large  # here: both convolutions and the classifier are small
    result = prune.prune_model(trained, digits_train(digits_dir), epochs=1,
                               steps_per_epoch=steps_per_epoch(digits_dir), target_sparsity=0.8)
    assert result.small_layers == small
    kernels = _kernels(result.model)
    for name in small:
        assert (kernels[name] == 0).mean() < 0.05, name  # fine-tuned, not pruned
    for name in large:
        assert abs((kernels[name] == 0).mean() - 0.8) < 0.01, name
    report = prune.sparsity_report(result.model, result.pruned_weights)
    assert [layer["layer"] for layer in report["layers"] if "sparsity" in layer] == large
    assert prune.check_sparsity_reached(report, 0.8) == []
    # A threshold above every layer leaves nothing to prune: one clear error that says why.
    with pytest.raises(TftrainError, match="lower --min_weights_to_prune"):
        prune.prune_model(trained, digits_train(digits_dir), epochs=1, steps_per_epoch=2,
                          min_weights=10**9)


def test_few_steps_still_reach_the_target(trained, digits_dir):
    # TFMOT's default frequency=100 leaves 0% sparsity with fewer steps; ours is derived.
    result = prune.prune_model(trained, digits_train(digits_dir), epochs=1, steps_per_epoch=6,
                               target_sparsity=0.5, schedule="constant")
    report = prune.sparsity_report(result.model, result.pruned_weights)
    assert result.schedule.frequency <= 6 and result.schedule.end_step <= 6
    assert prune.check_sparsity_reached(report, 0.5) == [], report


def test_2_by_4_structure_holds_on_the_weights(trained, digits_dir):
    result = prune.prune_model(trained, digits_train(digits_dir), epochs=1,
                               steps_per_epoch=steps_per_epoch(digits_dir), m_by_n=(2, 4),
                               min_weights=0)
    kernels = _kernels(result.model)
    # Checked directly: each run of 4 input-channel weights of each output keeps <= 2 non-zeros.
    for name in ("conv_b", "hidden", "logits"):
        kernel = kernels[name]
        rows = np.moveaxis(kernel, -1, 0).reshape(-1, kernel.shape[-2])
        assert ((rows.reshape(-1, 4) != 0).sum(axis=1) <= 2).all(), name
        assert prune.m_by_n_ok(kernel, (2, 4)) is True
    report = prune.sparsity_report(result.model, result.pruned_weights, (2, 4))
    by_name = {layer["layer"]: layer for layer in report["layers"]}
    # The first conv has one input channel: TFMOT silently leaves it dense, and the report says so.
    assert by_name["conv_a"]["m_by_n_ok"] is None and by_name["conv_a"]["sparsity"] < 0.1
    assert by_name["hidden"]["m_by_n_ok"] is True
    assert abs(by_name["hidden"]["sparsity"] - 0.5) < 0.01
    assert prune.check_sparsity_reached(report, 0.5, (2, 4)) == []


def test_m_by_n_check_detects_a_broken_block():
    kernel = np.ones((3, 3, 8, 4), np.float32)
    kernel[:, :, 0::2, :] = 0  # two zeros in every block of four input channels
    assert prune.m_by_n_ok(kernel, (2, 4)) is True
    kernel[1, 1, 0, 3] = 5.0
    assert prune.m_by_n_ok(kernel, (2, 4)) is False
    assert prune.m_by_n_ok(np.ones((3, 5)), (2, 4)) is None


@pytest.mark.parametrize("target", [0.0, 1.0, 1.5, -0.2])
def test_sparsity_outside_0_1_is_rejected(target, trained, digits_dir):
    with pytest.raises(ConfigError, match=r"outside \(0, 1\)"):
        prune.prune_model(trained, digits_train(digits_dir), epochs=1, steps_per_epoch=2,
                          target_sparsity=target)


def test_schedule_is_derived_from_the_real_number_of_steps():
    for total in (1, 2, 7, 44, 100, 1000, 12345):
        plan = prune.make_schedule("polynomial", 0.8, total)
        assert 1 <= plan.frequency <= plan.end_step <= total
        assert plan.end_step % plan.frequency == 0  # the last update lands on the target
    assert prune.make_schedule("polynomial", 0.8, 1000).frequency < 100
    with pytest.raises(ConfigError):
        prune.make_schedule("cosine", 0.8, 10)
    with pytest.raises(ConfigError, match="M:N"):
        prune.parse_m_by_n("2x4")
    with pytest.raises(ConfigError, match="0 < M < N"):
        prune.parse_m_by_n("4:4")
    assert prune.parse_m_by_n("2:4") == (2, 4) and prune.parse_m_by_n("") is None


def test_a_model_with_nothing_to_prune_is_a_clear_error(digits_dir):
    import tf_keras as keras

    inputs = keras.Input((8, 8, 1))
    model = keras.Model(inputs, keras.layers.LayerNormalization()(keras.layers.Flatten()(inputs)))
    with pytest.raises(TftrainError, match="no layer TFMOT can prune"):
        prune.prune_model(model, digits_train(digits_dir), epochs=1, steps_per_epoch=2)


def test_distillation_loss_is_the_weighted_hard_and_tempered_soft_terms():
    import tensorflow as tf
    import tf_keras as keras

    from tftrain.optimize import distill

    rng = np.random.default_rng(0)
    student, teacher = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    labels = np.array([0, 2, 1, 2])

    def softmax(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    hard = -np.log(softmax(student)[np.arange(4), labels])
    p, q = softmax(teacher / 2.0), softmax(student / 2.0)
    soft = (p * (np.log(p) - np.log(q))).sum(axis=-1) * 4.0
    loss = distill.DistillationLoss(keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                    weight=0.3, temperature=2.0)
    got = loss(labels, tf.constant(np.concatenate([student, teacher], -1), tf.float32)).numpy()
    np.testing.assert_allclose(got, (0.7 * hard + 0.3 * soft).mean(), rtol=1e-5)
    # Probabilities (from_logits=False) give the same distributions, hence the same loss.
    on_probs = distill.DistillationLoss(keras.losses.SparseCategoricalCrossentropy(), 0.3, 2.0)
    probs = np.concatenate([softmax(student), softmax(teacher)], -1)
    np.testing.assert_allclose(on_probs(labels, tf.constant(probs, tf.float32)).numpy(),
                               got, rtol=1e-4)


def test_distilled_pruning_leaves_the_float_teacher_out_of_the_result(trained, digits_dir):
    result = prune.prune_model(trained, digits_train(digits_dir), epochs=1,
                               steps_per_epoch=steps_per_epoch(digits_dir), distill_weight=0.5)
    assert result.distilled
    # The stripped student alone: same inputs and outputs as the trained model, no teacher.
    assert result.model.count_params() == trained.count_params()
    assert [l.name for l in result.model.layers] == [l.name for l in trained.layers]
    with pytest.raises(ConfigError, match="distill_weight"):
        prune.prune_model(trained, digits_train(digits_dir), epochs=1, steps_per_epoch=2,
                          distill_weight=1.5)

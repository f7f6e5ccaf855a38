"""Mixup and cutmix (`tftrain.data.mixing`): the Beta draws' statistics (and that the check
catches tensorflow/models#13490's sampler), mixup's blend, cutmix's boxes against the targets,
the per-batch choices' frequencies, determinism, weights, graph mode. Small tensors, no model."""
import math

import numpy as np
import pytest
import tensorflow as tf

from tftrain.data import mixing

DRAWS = 20_000


def beta_moments_match(draws, alpha):
    """Whether the draws' mean and variance are those of Beta(alpha, alpha), within 5 standard
    errors of the sampling (deterministic seeds: the margin is for a correct sampler's spread,
    not for flakiness)."""
    draws = np.asarray(draws, np.float64)
    n = draws.size
    var = 1.0 / (4.0 * (2.0 * alpha + 1.0))
    fourth = var**2 * (3.0 - 6.0 / (2.0 * alpha + 3.0))  # symmetric Beta's 4th central moment
    mean_error = abs(draws.mean() - 0.5) / math.sqrt(var / n)
    var_error = abs(draws.var() - var) / math.sqrt((fourth - var**2) / n)
    return mean_error < 5 and var_error < 5


@pytest.mark.parametrize("alpha", [0.2, 0.8, 1.0])
def test_beta_draws_have_the_mean_and_variance_of_beta(alpha):
    draws = mixing.sample_beta([DRAWS], alpha, tf.constant([7, int(alpha * 10)]))
    assert draws.dtype == tf.float32 and draws.shape == [DRAWS]
    assert beta_moments_match(draws.numpy(), alpha), (alpha, draws.numpy().var())
    assert np.all((draws.numpy() >= 0) & (draws.numpy() <= 1))


@pytest.mark.parametrize("alpha", [0.2, 0.8])
def test_the_moment_check_rejects_the_sampler_of_models_13490(alpha):
    # Model Garden's MixupAndCutmix drew tf.random.gamma(shape, 1.0, beta=alpha): Gamma(1)
    # with rate alpha, whose ratio is Uniform(0, 1) whatever alpha (identical to Beta(1, 1)
    # only at alpha = 1, so only 0.2 and 0.8 can tell them apart).
    seeds = tf.random.experimental.stateless_split(tf.constant([7, 1]), 2)
    g1 = tf.random.stateless_gamma([DRAWS], seeds[0], alpha=1.0) / alpha
    g2 = tf.random.stateless_gamma([DRAWS], seeds[1], alpha=1.0) / alpha
    assert not beta_moments_match((g1 / (g1 + g2)).numpy(), alpha)


def test_sample_beta_never_returns_nan_for_a_tiny_alpha():
    draws = mixing.sample_beta([DRAWS], 0.005, tf.constant([3, 4])).numpy()
    assert not np.isnan(draws).any()
    assert 0.4 < np.mean(draws > 0.5) < 0.6  # the 0-or-1 coin for underflowed pairs is fair


def batch(size=8, height=12, width=20, channels=3, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.random((size, height, width, channels), dtype=np.float32)
    labels = rng.permutation(size).astype(np.int64)  # distinct classes: shares readable
    return images, labels


def shares(targets, labels):
    """(own share, partner's share) per example, read from the targets."""
    rows = np.arange(len(labels))
    return targets[rows, labels], targets[rows, labels[::-1]]


def test_mixup_blends_each_image_with_the_reversed_batch_by_its_target_shares():
    images, labels = batch()
    mixed, targets, weights = mixing.mix_batch(
        images, labels, tf.constant([1, 2]), num_classes=10, mixup_alpha=0.8, cutmix_alpha=0.0)
    mixed, targets = mixed.numpy(), targets.numpy()
    assert weights is None and targets.shape == (8, 10) and targets.dtype == np.float32
    own, partner = shares(targets, labels)
    assert len(set(own.tolist())) == 8  # one draw per example
    np.testing.assert_array_equal(partner, np.float32(1) - own)
    expected = own[:, None, None, None] * images + partner[:, None, None, None] * images[::-1]
    np.testing.assert_array_equal(mixed, expected)
    rest = targets.copy()
    rest[np.arange(8), labels] = 0
    rest[np.arange(8), labels[::-1]] = 0
    assert not rest.any()


def test_mixup_share_follows_beta_over_many_examples():
    images = np.zeros((DRAWS, 1, 1, 1), np.float32)
    labels = np.arange(DRAWS) % 2  # partner (reversed) has the other class
    _, targets, _ = mixing.mix_batch(images, labels, tf.constant([5, 5]), num_classes=2,
                                     mixup_alpha=0.2, cutmix_alpha=0.0)
    own = targets.numpy()[np.arange(DRAWS), labels]
    assert beta_moments_match(own, 0.2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cutmix_pastes_one_clipped_box_whose_area_is_the_partners_target_share(seed):
    size, height, width = 64, 12, 20
    images = np.broadcast_to(np.arange(1, size + 1, dtype=np.float32)[:, None, None, None],
                             (size, height, width, 1)).copy()  # image i is the constant i + 1
    labels = np.arange(size)
    mixed, targets, _ = mixing.mix_batch(images, labels, tf.constant([seed, 9]),
                                         num_classes=size, mixup_alpha=0.0, cutmix_alpha=1.0)
    mixed, targets = mixed.numpy()[..., 0], targets.numpy()
    own, partner = shares(targets, labels)
    interior = 0
    for i in range(size):
        j = size - 1 - i
        pasted = mixed[i] == j + 1
        assert np.all(pasted | (mixed[i] == i + 1))  # only its own and its partner's pixels
        assert partner[i] == np.float32(pasted.sum()) / np.float32(height * width), i
        assert own[i] == np.float32(1) - partner[i]
        if pasted.any():  # one axis-aligned box
            rows, cols = np.flatnonzero(pasted.any(1)), np.flatnonzero(pasted.any(0))
            assert pasted.sum() == len(rows) * len(cols)
            assert pasted[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1].all()
            if 0 < rows[0] and rows[-1] < height - 1 and 0 < cols[0] and cols[-1] < width - 1:
                # Unclipped: sides in the image's proportions (both sqrt(1 - lam) of theirs).
                interior += 1
                assert abs(len(rows) / height - len(cols) / width) <= 1 / height + 1 / width
    assert interior >= 3 and 0 < partner.mean() < 1


def mixed_kinds(count, **options):
    """For `count` seeds, what mix_batch did to a batch of a black and a white 6x6 image:
    'none' (unchanged), 'mixup' (grey levels) or 'cutmix' (black and white, changed)."""
    images = tf.constant(np.stack([np.zeros((6, 6, 1)), np.ones((6, 6, 1))]), tf.float32)

    def kind(i):
        mixed, _, _ = mixing.mix_batch(images, [0, 1], tf.stack([i, tf.constant(3, tf.int64)]),
                                       num_classes=2, **options)
        grey = tf.reduce_any((mixed > 0) & (mixed < 1))
        changed = tf.reduce_any(mixed != images)
        return tf.where(grey, 1, tf.where(changed, 2, 0))

    kinds = tf.data.Dataset.range(count).map(kind).batch(count).get_single_element().numpy()
    return {name: int(np.sum(kinds == k)) for k, name in enumerate(["none", "mixup", "cutmix"])}


def within_sampling_error(hits, count, p):
    return abs(hits / count - p) <= 4 * math.sqrt(p * (1 - p) / count)


def test_switch_prob_is_the_share_of_batches_that_use_cutmix():
    # 6x6 and Beta(1, 1): an empty cutmix box (looks unmixed) needs 1 - lam < 1/36.
    kinds = mixed_kinds(2000, mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.3)
    assert kinds["mixup"] + kinds["cutmix"] + kinds["none"] == 2000 and kinds["none"] < 100
    assert within_sampling_error(kinds["cutmix"] + kinds["none"], 2000, 0.3), kinds


def test_mix_prob_is_the_share_of_batches_mixed_at_all():
    kinds = mixed_kinds(2000, mixup_alpha=0.8, cutmix_alpha=0.0, mix_prob=0.6)
    assert kinds["cutmix"] == 0
    assert within_sampling_error(kinds["mixup"], 2000, 0.6), kinds


def test_an_unmixed_batch_has_one_hot_targets_and_its_own_images():
    images, labels = batch()
    for options in (dict(mixup_alpha=0.0, cutmix_alpha=0.0),
                    dict(mixup_alpha=0.8, cutmix_alpha=1.0, mix_prob=0.0)):
        mixed, targets, weights = mixing.mix_batch(images, labels, tf.constant([1, 1]),
                                                   num_classes=8, weights=np.ones(8), **options)
        np.testing.assert_array_equal(mixed.numpy(), images)
        np.testing.assert_array_equal(targets.numpy(), np.eye(8, dtype=np.float32)[labels])
        np.testing.assert_array_equal(weights.numpy(), np.ones(8))


@pytest.mark.parametrize("alphas", [(0.8, 0.0), (0.0, 1.0), (0.8, 1.0)])
def test_the_same_seed_mixes_the_same_way_and_another_seed_differently(alphas):
    images, labels = batch()

    def run(seed):
        mixed, targets, _ = mixing.mix_batch(images, labels, tf.constant(seed, tf.int64),
                                             num_classes=8, mixup_alpha=alphas[0],
                                             cutmix_alpha=alphas[1])
        return mixed.numpy(), targets.numpy()

    first, again, other = run([4, 2]), run([4, 2]), run([4, 3])
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    assert not np.array_equal(first[1], other[1])


@pytest.mark.parametrize("alphas", [(0.8, 0.0), (0.0, 1.0)])
def test_weights_are_mixed_with_the_targets_shares(alphas):
    images, labels = batch()
    weights = np.arange(1, 9, dtype=np.float32)
    _, targets, mixed_weights = mixing.mix_batch(
        images, labels, tf.constant([8, 8]), num_classes=8, mixup_alpha=alphas[0],
        cutmix_alpha=alphas[1], weights=weights)
    own, partner = shares(targets.numpy(), labels)
    np.testing.assert_array_equal(mixed_weights.numpy(), own * weights + partner * weights[::-1])
    assert not np.array_equal(mixed_weights.numpy(), weights)


def test_in_a_tf_data_map_with_an_unknown_batch_size_it_mixes_as_eagerly():
    images, labels = batch(size=7)
    options = dict(num_classes=8, mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5)
    seeds = tf.constant([[1, 0], [1, 1], [1, 2], [1, 3]], tf.int64)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(3)  # 3, 3, 1: [None, ...]
    data = tf.data.Dataset.zip((data, tf.data.Dataset.from_tensor_slices(seeds)))
    assert data.element_spec[0][0].shape[0] is None
    mapped = data.map(lambda xy, seed: mixing.mix_batch(*xy, seed, **options)[:2])
    for (x, y), seed, (mixed, targets) in zip(
            [(images[:3], labels[:3]), (images[3:6], labels[3:6]), (images[6:], labels[6:])],
            seeds, mapped):
        eager = mixing.mix_batch(x, y, seed, **options)
        np.testing.assert_array_equal(mixed.numpy(), eager[0].numpy())
        np.testing.assert_array_equal(targets.numpy(), eager[1].numpy())


@pytest.mark.parametrize("options, message", [
    (dict(mixup_alpha=-0.1, cutmix_alpha=0.0), "mixup_alpha must be >= 0, got -0.1"),
    (dict(mixup_alpha=0.2, cutmix_alpha=0.0, switch_prob=1.5), "switch_prob must be in [0, 1]"),
    (dict(mixup_alpha=0.2, cutmix_alpha=0.0, mix_prob=-1), "mix_prob must be in [0, 1]"),
])
def test_options_out_of_range_are_refused(options, message):
    images, labels = batch()
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        mixing.mix_batch(images, labels, [1, 2], num_classes=8, **options)
    with pytest.raises(ValueError, match="alpha must be > 0, got 0"):
        mixing.sample_beta([3], 0, [1, 2])

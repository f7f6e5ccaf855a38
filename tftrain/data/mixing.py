"""Batch-level mixup and cutmix: images blended with a partner and soft targets to match.

Every random draw is stateless, from the `seed` a caller derives from (seed, epoch, position),
so a batch mixes the same way when a resumed run reads it again. The partner of example `i` is
example `B - 1 - i` (the batch reversed), as in Model Garden and timm.
"""
from __future__ import annotations

from typing import Optional, Tuple

import tensorflow as tf


def sample_beta(shape, alpha: float, seed) -> tf.Tensor:
    """Draws float32 samples of Beta(alpha, alpha) of `shape` (a list or a 1-D int tensor).

    TensorFlow has no Beta sampler: a Beta(a, a) draw is G1 / (G1 + G2) of two independent
    Gamma(a) draws (concentration a, rate 1). `seed` is a stateless seed (int32 or int64 [2]).
    """
    if not alpha > 0:
        raise ValueError(f"sample_beta: alpha must be > 0, got {alpha}")
    seeds = tf.random.experimental.stateless_split(seed, 3)
    # float64: with a small alpha a float32 Gamma draw underflows to 0 far more often.
    g1 = tf.random.stateless_gamma(shape, seeds[0], alpha=alpha, dtype=tf.float64)
    g2 = tf.random.stateless_gamma(shape, seeds[1], alpha=alpha, dtype=tf.float64)
    total = g1 + g2
    # Both draws underflowed: the ratio is then ~0 or ~1 with equal chance.
    coin = tf.round(tf.random.stateless_uniform(shape, seeds[2], dtype=tf.float64))
    ratio = tf.where(total > 0, g1 / tf.where(total > 0, total, 1.0), coin)
    return tf.cast(ratio, tf.float32)


def mix_batch(images, labels, seed, *, num_classes: int, mixup_alpha: float,
              cutmix_alpha: float, switch_prob: float = 0.5, mix_prob: float = 1.0,
              weights=None) -> Tuple[tf.Tensor, tf.Tensor, Optional[tf.Tensor]]:
    """Mixes a batch with its reverse by mixup or cutmix; returns (images, targets, weights).

    images: float [B, H, W, C] (B may be unknown until run time); labels: integer class ids
    [B] (or [B, 1]); seed: a stateless seed (int32 or int64 [2]). targets: float32
    [B, num_classes], `w * one_hot(label) + (1 - w) * one_hot(partner's label)` where `w` is the
    share of the example that is its own. `weights` (per-example sample weights [B], or None)
    are mixed with the same shares.

    One choice per batch: with probability `mix_prob` the batch is mixed (else it is returned
    with one-hot targets); a mixed batch uses cutmix with probability `switch_prob` when both
    alphas are > 0, else the one whose alpha is > 0. Mixup: `w ~ Beta(mixup_alpha,
    mixup_alpha)` per example, image `w * x + (1 - w) * partner`. Cutmix: per example a box of
    sides `sqrt(1 - lam) * (H, W)` with `lam ~ Beta(cutmix_alpha, cutmix_alpha)`, centred
    uniformly over the image and clipped at its borders, filled from the partner; the partner's
    share is the box's clipped area over the image's, exactly. Both alphas 0: no mixing.
    """
    _check_options(mixup_alpha, cutmix_alpha, switch_prob, mix_prob)
    images = tf.convert_to_tensor(images)
    labels = tf.reshape(tf.convert_to_tensor(labels), [-1])
    one_hot = tf.one_hot(labels, num_classes, dtype=tf.float32)
    batch = tf.shape(images)[0]
    unmixed = (images, tf.ones([batch], tf.float32), tf.zeros([batch], tf.float32))
    if mixup_alpha == 0 and cutmix_alpha == 0:
        mixed_images, own, partner = unmixed
    else:
        mix_seed, switch_seed, op_seed = tf.unstack(
            tf.random.experimental.stateless_split(seed, 3))

        def mix():
            if mixup_alpha == 0:
                return _cutmix(images, cutmix_alpha, op_seed)
            if cutmix_alpha == 0:
                return _mixup(images, mixup_alpha, op_seed)
            use_cutmix = tf.random.stateless_uniform([], switch_seed) < switch_prob
            return tf.cond(use_cutmix, lambda: _cutmix(images, cutmix_alpha, op_seed),
                           lambda: _mixup(images, mixup_alpha, op_seed))

        do_mix = tf.random.stateless_uniform([], mix_seed) < mix_prob
        mixed_images, own, partner = tf.cond(do_mix, mix, lambda: unmixed)
    targets = own[:, None] * one_hot + partner[:, None] * tf.reverse(one_hot, [0])
    if weights is not None:
        weights = tf.cast(weights, tf.float32)
        weights = own * weights + partner * tf.reverse(weights, [0])
    return mixed_images, targets, weights


def _check_options(mixup_alpha, cutmix_alpha, switch_prob, mix_prob):
    for name, value in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
        if not value >= 0:
            raise ValueError(f"mix_batch: {name} must be >= 0, got {value}")
    for name, value in (("switch_prob", switch_prob), ("mix_prob", mix_prob)):
        if not 0 <= value <= 1:
            raise ValueError(f"mix_batch: {name} must be in [0, 1], got {value}")


def _mixup(images, alpha, seed):
    """Blends each image with its partner; returns (images, own shares, partner shares)."""
    own = sample_beta(tf.shape(images)[:1], alpha, seed)
    partner = 1.0 - own
    dtype = images.dtype
    mixed = (tf.cast(own, dtype)[:, None, None, None] * images
             + tf.cast(partner, dtype)[:, None, None, None] * tf.reverse(images, [0]))
    return mixed, own, partner


def _cutmix(images, alpha, seed):
    """Pastes a box of each partner into each image; returns (images, own, partner shares)."""
    shape = tf.shape(images)
    batch, height, width = shape[0], shape[1], shape[2]
    lam_seed, y_seed, x_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    side = tf.sqrt(1.0 - sample_beta([batch], alpha, lam_seed))
    rows, row_count = _box_span(side, height, y_seed)
    cols, col_count = _box_span(side, width, x_seed)
    inside = rows[:, :, None, None] & cols[:, None, :, None]
    mixed = tf.where(inside, tf.reverse(images, [0]), images)
    partner = tf.cast(row_count * col_count, tf.float32) / tf.cast(height * width, tf.float32)
    return mixed, 1.0 - partner, partner


def _box_span(side, size, seed):
    """Per example, which of `size` positions a box of `side * size` centred uniformly at
    random covers once clipped: (bool [B, size], covered count [B])."""
    batch = tf.shape(side)[0]
    length = tf.cast(side * tf.cast(size, tf.float32), tf.int32)
    center = tf.random.stateless_uniform([batch], seed, minval=0, maxval=size, dtype=tf.int32)
    start = tf.clip_by_value(center - length // 2, 0, size)
    end = tf.clip_by_value(center - length // 2 + length, 0, size)
    positions = tf.range(size)[None, :]
    covered = (positions >= start[:, None]) & (positions < end[:, None])
    return covered, end - start

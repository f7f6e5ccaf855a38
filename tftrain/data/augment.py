"""The training input's augment stage (`data.augment`), in the tf.data pipeline on the host.

Every random draw is a stateless op keyed by (seed, input pipeline, the batch's position in the
training stream): the batch at position p is the same whatever came before it, so a run
resumed at `start_batch` sees exactly the batches of the uninterrupted run, and every input
pipeline (worker) draws its own. Each batch's seed is split into one seed per augmentation and
then one per example (`batch_seeds`, `example_seeds`).

In order: the random resized crop (inside the decode, `pipelines.images.decode_image_batch`:
only the window of a JPEG is decoded; on decoded-cached batches one `crop_and_resize`), the
horizontal flip (vectorized), RandAugment and random erasing (per image, `image_ops`), the
class weights of a weighted input, then mixup/cutmix of the whole batch (`mixing.mix_batch`):
the label becomes a soft target [batch, num_classes].
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import tensorflow as tf

from pipelines import images as image_lib
from tftrain.data import image_ops, mixing
from tftrain.data.augment_options import Augment

# The draws of a batch, one seed each (`batch_seeds`); their order is part of the stream.
DRAWS = ("crop", "flip", "randaugment", "erasing", "mix")


def batch_seeds(seed: int, pipeline_id: int, position) -> dict:
    """One seed ([2] int64) per draw of `DRAWS` for the batch at `position` (a scalar) of input
    pipeline `pipeline_id`'s training stream under `seed` (`train.seed`)."""
    base = tf.random.experimental.stateless_fold_in(
        tf.constant([seed, 0], tf.int64), tf.constant(pipeline_id, tf.int64))
    batch = tf.random.experimental.stateless_fold_in(base, tf.cast(position, tf.int64))
    return {name: tf.random.experimental.stateless_fold_in(batch, tf.constant(i, tf.int64))
            for i, name in enumerate(DRAWS)}


def example_seeds(seed, count) -> tf.Tensor:
    """`count` seeds ([count, 2] int64) drawn from `seed`, one per example of a batch."""
    return tf.random.stateless_uniform(tf.stack([count, 2]), seed, minval=None, maxval=None,
                                       dtype=tf.int64)


def flip_mask(seed, count) -> tf.Tensor:
    """Which of `count` examples the flip of `seed` mirrors: a uniform below 0.5 each."""
    return tf.random.stateless_uniform(tf.reshape(count, [1]), seed) < 0.5


@dataclasses.dataclass(frozen=True)
class Stage:
    """The augment stage of one input pipeline: `apply` maps it over the batched stream.

    `image_shape`: the pipeline's training (height, width, channels); `num_classes`: the
    dataset's (needed to mix labels); `pipeline_id`: this input pipeline's index (workers, or
    a pipeline run's worker slices, draw differently)."""

    options: Augment
    seed: int
    image_shape: tuple
    num_classes: int | None = None
    pipeline_id: int = 0

    def crop_info(self, seeds) -> dict:
        """What the decode adds to the manifest's `info` to take a random crop per example
        (`seeds` [batch, 2]); {} without `random_resized_crop`."""
        if not self.options.crop:
            return {}
        return {"random_crop": {"scale": self.options.crop["scale"],
                                "ratio": self.options.crop["ratio"], "seeds": seeds}}

    def apply(self, dataset: tf.data.Dataset, start_batch: int, decode,
              label_weights: Sequence[float] | None, deterministic: bool) -> tf.data.Dataset:
        """`dataset` (batches of serialized records, or of decoded `(images, labels)` when
        `decode` is None: the decoded cache) augmented; batch i is position `start_batch` + i.
        `decode(serialized, extra_info)` is the reader's parse and decode. Yields
        `(images, labels)`, plus the sample weights with `label_weights`."""
        weighted = label_weights is not None

        @tf.autograph.experimental.do_not_convert  # plain TF ops
        def augmented(position, batch):
            seeds = batch_seeds(self.seed, self.pipeline_id, position)
            if decode is not None:
                count = tf.shape(batch)[0]
                images, labels = decode(batch, self.crop_info(
                    example_seeds(seeds["crop"], count)))
            else:
                images, labels = batch
                count = tf.shape(images)[0]
                if self.options.crop:
                    images = image_lib.random_crop_batch(
                        images, example_seeds(seeds["crop"], count), self.options.crop["scale"],
                        self.options.crop["ratio"], *self.image_shape[:2])
            images = self.per_image(images, seeds, count)
            weights = label_weights_of(label_weights, labels) if weighted else None
            if self.options.mixes:
                images, labels, weights = self.mix(images, labels, weights, seeds["mix"])
            return (images, labels) + ((weights,) if weighted else ())

        return dataset.enumerate(start_batch).map(
            augmented, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)

    def per_image(self, images, seeds: dict, count):
        """The flip, RandAugment and random erasing of a decoded batch."""
        if self.options.flip:
            images = tf.where(flip_mask(seeds["flip"], count)[:, None, None, None],
                              tf.reverse(images, axis=[2]), images)
        if self.options.randaugment:
            layers, magnitude = (self.options.randaugment["num_layers"],
                                 self.options.randaugment["magnitude"])
            images = _each(lambda image, seed: image_ops.randaugment(image, seed, layers,
                                                                     magnitude),
                           images, example_seeds(seeds["randaugment"], count))
        if self.options.random_erasing:
            probability = self.options.random_erasing
            images = _each(lambda image, seed: image_ops.random_erasing(image, seed, probability),
                           images, example_seeds(seeds["erasing"], count))
        return images

    def mix(self, images, labels, weights, seed):
        """Mixup/cutmix of the batch (`mixing.mix_batch`): soft targets [batch, classes]."""
        options = self.options
        return mixing.mix_batch(
            images, tf.reshape(labels, [-1]), seed, num_classes=self.num_classes,
            mixup_alpha=options.mixup_alpha, cutmix_alpha=options.cutmix_alpha,
            switch_prob=options.switch_prob, mix_prob=options.mix_prob, weights=weights)


def label_weights_of(label_weights: Sequence[float], labels) -> tf.Tensor:
    """Each example's weight: `label_weights[its label]` (a scalar integer label each)."""
    table = tf.constant(list(label_weights), tf.float32)
    weight = tf.reshape(tf.gather(table, tf.cast(labels, tf.int32)), tf.shape(labels)[:1])
    weight.set_shape(labels.shape[:1])
    return weight


def _each(function, images, seeds):
    """`function(image, seed)` over a batch, one image at a time (ops defined per image)."""
    return tf.map_fn(lambda args: function(*args), (images, seeds), parallel_iterations=1,
                     fn_output_signature=tf.TensorSpec(images.shape[1:], images.dtype))

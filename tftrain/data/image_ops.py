"""Per-image augmentation ops: RandAugment and random erasing, stateless and graph-safe.

Each op takes ONE float32 image [H, W, C] in [0, 1] (C = 1 or 3, known statically; H and W may
be known only at run time) and a stateless seed (int32 or int64 [2]), and returns an image of
the same shape in [0, 1]: the same seed gives the same image, so a caller that derives the seed
from (seed, epoch, position) augments a resumed run's examples as the uninterrupted run did.

RandAugment follows Model Garden's (official/vision/ops/augment.py, `RandAugment`): its 16 ops
and levels (`magnitude / 10` of each op's range), a random sign where it has one, grey (128 of
255) where a geometric op leaves the image, and an op chosen uniformly among the 16 and
"identity" at each layer. Where it measures in pixels at 224x224 (translation: 100, cutout's
half side: 40) the distance here is that fraction of the image's side, so the same magnitude
means the same on smaller images. Posterize, equalize and autocontrast work on the image
quantized to 0..255, as PIL's do; solarize and solarize-add compare its levels.
"""
from __future__ import annotations

import math

import tensorflow as tf

_MAX_LEVEL = 10.0
_MAX_MAGNITUDE = 30.0  # rotate reaches 90 degrees; enhance factors 5.5
_GREY = 0.5  # Model Garden's fill value 128 of 255
_TRANSLATE_FRACTION = 100.0 / 224.0
_CUTOUT_FRACTION = 40.0 / 224.0
_SMOOTH = [[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]  # PIL's SMOOTH filter, / 13

_ERASE_AREA = (0.02, 1.0 / 3.0)
_ERASE_LOG_ASPECT = (math.log(0.3), math.log(1.0 / 0.3))
_ERASE_TRIALS = 10


def randaugment(image, seed, num_layers: int, magnitude: float) -> tf.Tensor:
    """Applies `num_layers` RandAugment ops, each chosen uniformly among Model Garden's 16 and
    identity, at `magnitude` (0..30; 10 is Model Garden's maximum level), to one image."""
    if not (isinstance(num_layers, int) and num_layers >= 0):
        raise ValueError(f"randaugment: num_layers must be an integer >= 0, got {num_layers}")
    if not 0 <= magnitude <= _MAX_MAGNITUDE:
        raise ValueError(f"randaugment: magnitude must be in [0, {_MAX_MAGNITUDE:g}], "
                         f"got {magnitude}")
    image = _checked_image(image, "randaugment")
    if num_layers == 0:
        return image
    choices, op_seeds = layer_choices(seed, num_layers)
    for layer in range(num_layers):
        branches = [
            (lambda op=op, image=image, op_seed=op_seeds[layer]: op(image, magnitude, op_seed))
            for op in OPS.values()]
        image = tf.switch_case(choices[layer], branches,
                               default=lambda image=image: tf.identity(image))
    return image


def layer_choices(seed, num_layers: int):
    """Which op each layer applies (an index into `OPS`; `len(OPS)` is identity), int32
    [num_layers], and each layer's seed for its op's own draws, [num_layers, 2]."""
    seeds = tf.random.experimental.stateless_split(seed, 2 * num_layers)
    choices = tf.stack([
        tf.random.stateless_uniform([], seeds[2 * layer], minval=0, maxval=len(OPS) + 1,
                                    dtype=tf.int32)
        for layer in range(num_layers)])
    return choices, seeds[1::2]


def random_erasing(image, seed, probability: float) -> tf.Tensor:
    """With `probability`, fills one box of the image with uniform noise in [0, 1) (timm's
    RandomErasing, per-pixel mode): area 2%..1/3 of the image, aspect (height / width)
    log-uniform in 0.3..3.3, the first of 10 candidate boxes that fits, placed uniformly."""
    if not 0 <= probability <= 1:
        raise ValueError(f"random_erasing: probability must be in [0, 1], got {probability}")
    image = _checked_image(image, "random_erasing")
    if probability == 0:
        return image
    coin_seed, area_seed, aspect_seed, top_seed, left_seed, noise_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 6))
    shape = tf.shape(image)
    height, width = shape[0], shape[1]

    def erase():
        area = tf.cast(height * width, tf.float32) * tf.random.stateless_uniform(
            [_ERASE_TRIALS], area_seed, *_ERASE_AREA)
        aspect = tf.exp(tf.random.stateless_uniform([_ERASE_TRIALS], aspect_seed,
                                                    *_ERASE_LOG_ASPECT))
        box_h = tf.cast(tf.round(tf.sqrt(area * aspect)), tf.int32)
        box_w = tf.cast(tf.round(tf.sqrt(area / aspect)), tf.int32)
        fits = (box_h < height) & (box_w < width)
        first = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)
        # No candidate fits (a sliver of an image): an empty box, so the placement stays valid.
        box_h = tf.where(tf.reduce_any(fits), box_h[first], 0)
        box_w = tf.where(tf.reduce_any(fits), box_w[first], 0)
        top = tf.random.stateless_uniform([], top_seed, 0, height - box_h + 1, tf.int32)
        left = tf.random.stateless_uniform([], left_seed, 0, width - box_w + 1, tf.int32)
        inside = _box_mask(height, width, top, top + box_h, left, left + box_w)
        noise = tf.random.stateless_uniform(shape, noise_seed, dtype=image.dtype)
        return tf.where(inside, noise, image)

    apply = tf.random.stateless_uniform([], coin_seed) < probability
    return tf.cond(apply, erase, lambda: image)


def _checked_image(image, where):
    image = tf.convert_to_tensor(image, tf.float32)
    if image.shape.rank != 3 or image.shape[-1] not in (1, 3):
        raise ValueError(f"{where}: expects one image [height, width, 1 or 3 channels] with "
                         f"the channels known statically, got shape {image.shape}")
    return image


def _box_mask(height, width, top, bottom, left, right):
    """bool [H, W, 1]: True inside rows [top, bottom) and columns [left, right)."""
    rows = tf.range(height)
    cols = tf.range(width)
    in_rows = (rows >= top) & (rows < bottom)
    in_cols = (cols >= left) & (cols < right)
    return (in_rows[:, None] & in_cols[None, :])[:, :, None]


def _level(magnitude):
    return magnitude / _MAX_LEVEL


def _random_sign(value, seed):
    """`value` or `-value`, each with probability 1/2 (Model Garden's random negation)."""
    flip = tf.random.stateless_uniform([], seed) < 0.5
    return tf.where(flip, -value, value)


def _quantized(image):
    """The image as integer levels 0..255 (int32)."""
    return tf.cast(tf.round(tf.clip_by_value(image, 0.0, 1.0) * 255.0), tf.int32)


def _from_levels(levels):
    return tf.cast(levels, tf.float32) / 255.0


def _blend(degenerate, image, factor):
    """PIL's ImageEnhance: `degenerate + factor * (image - degenerate)`, clipped to [0, 1]."""
    return tf.clip_by_value(degenerate + factor * (image - degenerate), 0.0, 1.0)


def _grayscale(image):
    """The luma of an RGB image ([H, W, 1]); a one-channel image is its own."""
    return image if image.shape[-1] == 1 else tf.image.rgb_to_grayscale(image)


def _transform(image, transform):
    """`image` resampled (nearest) where output (x, y) reads input (a0 x + a1 y + a2,
    b0 x + b1 y + b2), grey outside the image."""
    transform = tf.cast(tf.stack(transform), tf.float32)[None, :]
    out = tf.raw_ops.ImageProjectiveTransformV3(
        images=image[None], transforms=transform, output_shape=tf.shape(image)[:2],
        fill_value=_GREY, interpolation="NEAREST", fill_mode="CONSTANT")
    return tf.ensure_shape(out[0], image.shape)


def auto_contrast(image, magnitude, seed):
    """Each channel stretched so that its darkest level is 0 and its brightest 255."""
    del magnitude, seed
    levels = _quantized(image)
    low = tf.cast(tf.reduce_min(levels, axis=[0, 1]), tf.float64)
    high = tf.cast(tf.reduce_max(levels, axis=[0, 1]), tf.float64)
    scale = 255.0 / tf.maximum(high - low, 1.0)
    # PIL's table, in double precision as PIL computes it: int(level * scale + offset).
    lut = tf.floor(tf.range(256, dtype=tf.float64)[:, None] * scale - low * scale)
    identity = tf.range(256, dtype=tf.float64)[:, None]
    lut = tf.where(high > low, tf.clip_by_value(lut, 0.0, 255.0), identity)
    return _from_levels(_lookup(tf.cast(lut, tf.int32), levels))


def equalize(image, magnitude, seed):
    """PIL's ImageOps.equalize per channel: levels remapped by their cumulative histogram."""
    del magnitude, seed
    levels = _quantized(image)
    channels = image.shape[-1]
    histogram = tf.reshape(
        tf.math.bincount(levels * channels + tf.range(channels), minlength=256 * channels,
                         maxlength=256 * channels), [256, channels])
    # PIL leaves the count of each channel's top level out of the step.
    top_count = _lookup(histogram, tf.reduce_max(levels, axis=[0, 1]))
    step = (tf.reduce_sum(histogram, axis=0) - top_count) // 255
    safe_step = tf.maximum(step, 1)
    lut = (tf.cumsum(histogram, axis=0, exclusive=True) + safe_step // 2) // safe_step
    lut = tf.where(step > 0, tf.clip_by_value(lut, 0, 255), tf.range(256)[:, None])
    return _from_levels(_lookup(lut, levels))


def _lookup(lut, levels):
    """Each channel's levels mapped through its column of `lut` ([256, C] int32)."""
    channels = levels.shape[-1]
    return tf.gather(tf.reshape(lut, [-1]), levels * channels + tf.range(channels))


def invert(image, magnitude, seed):
    """1 - image."""
    del magnitude, seed
    return 1.0 - image


def rotate(image, magnitude, seed):
    """Rotated about its centre by `level * 30` degrees, either way."""
    degrees = _random_sign(_level(magnitude) * 30.0, seed)
    return _rotate_degrees(image, degrees)


def _rotate_degrees(image, degrees):
    radians = tf.cast(degrees, tf.float32) * (math.pi / 180.0)
    shape = tf.cast(tf.shape(image), tf.float32)
    height, width = shape[0] - 1.0, shape[1] - 1.0
    cos, sin = tf.cos(radians), tf.sin(radians)
    x_offset = (width - (cos * width - sin * height)) / 2.0
    y_offset = (height - (sin * width + cos * height)) / 2.0
    return _transform(image, [cos, -sin, x_offset, sin, cos, y_offset, 0.0, 0.0])


def posterize(image, magnitude, seed):
    """Only the top `int(level * 4)` bits of each level kept (0 bits: black, as in Model
    Garden)."""
    del seed
    shift = min(max(8 - int(_level(magnitude) * 4), 0), 8)
    levels = _quantized(image)
    return _from_levels(tf.bitwise.left_shift(tf.bitwise.right_shift(levels, shift), shift))


def solarize(image, magnitude, seed):
    """Pixels whose level (0..255) is at or above `int(level * 256)` inverted."""
    del seed
    threshold = int(_level(magnitude) * 256)
    return tf.where(_quantized(image) < threshold, image, 1.0 - image)


def solarize_add(image, magnitude, seed):
    """`int(level * 110)` levels (of 255) added to the pixels whose level is below 128."""
    del seed
    addition = int(_level(magnitude) * 110) / 255.0
    return tf.where(_quantized(image) < 128, tf.minimum(image + addition, 1.0), image)


def _enhance_factor(magnitude):
    return _level(magnitude) * 1.8 + 0.1


def color(image, magnitude, seed):
    """PIL's Color: blended with its grayscale by `level * 1.8 + 0.1` (1: unchanged)."""
    del seed
    return _blend(_grayscale(image), image, _enhance_factor(magnitude))


def contrast(image, magnitude, seed):
    """PIL's Contrast: blended with its mean gray level by `level * 1.8 + 0.1`."""
    del seed
    mean = tf.reduce_mean(_grayscale(image))
    return _blend(mean, image, _enhance_factor(magnitude))


def brightness(image, magnitude, seed):
    """PIL's Brightness: scaled by `level * 1.8 + 0.1`, clipped."""
    del seed
    return _blend(tf.zeros_like(image), image, _enhance_factor(magnitude))


def sharpness(image, magnitude, seed):
    """PIL's Sharpness: blended with its SMOOTH-filtered self (the border kept) by
    `level * 1.8 + 0.1`."""
    del seed
    channels = image.shape[-1]
    kernel = tf.tile(tf.constant(_SMOOTH)[:, :, None, None] / 13.0, [1, 1, channels, 1])
    smooth = tf.nn.depthwise_conv2d(image[None], kernel, [1, 1, 1, 1], "SAME")[0]
    shape = tf.shape(image)
    inside = _box_mask(shape[0], shape[1], 1, shape[0] - 1, 1, shape[1] - 1)
    degenerate = tf.where(inside, smooth, image)
    return _blend(degenerate, image, _enhance_factor(magnitude))


def shear_x(image, magnitude, seed):
    """Sheared along x by `level * 0.3` (either way): output (x, y) reads (x + s * y, y)."""
    shear = _random_sign(_level(magnitude) * 0.3, seed)
    return _transform(image, [1.0, shear, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])


def shear_y(image, magnitude, seed):
    """Sheared along y by `level * 0.3` (either way): output (x, y) reads (x, y + s * x)."""
    shear = _random_sign(_level(magnitude) * 0.3, seed)
    return _transform(image, [1.0, 0.0, 0.0, shear, 1.0, 0.0, 0.0, 0.0])


def translate_x(image, magnitude, seed):
    """Shifted along x by `level * 100/224` of its width (either way), grey where it left."""
    width = tf.cast(tf.shape(image)[1], tf.float32)
    pixels = _random_sign(_level(magnitude) * _TRANSLATE_FRACTION * width, seed)
    return _transform(image, [1.0, 0.0, pixels, 0.0, 1.0, 0.0, 0.0, 0.0])


def translate_y(image, magnitude, seed):
    """Shifted along y by `level * 100/224` of its height (either way), grey where it left."""
    height = tf.cast(tf.shape(image)[0], tf.float32)
    pixels = _random_sign(_level(magnitude) * _TRANSLATE_FRACTION * height, seed)
    return _transform(image, [1.0, 0.0, 0.0, 0.0, 1.0, pixels, 0.0, 0.0])


def cutout(image, magnitude, seed):
    """A grey box of half-sides `level * 40/224` of the image's, centred uniformly, clipped."""
    shape = tf.shape(image)
    height, width = shape[0], shape[1]
    fraction = _level(magnitude) * _CUTOUT_FRACTION
    half_h = tf.cast(fraction * tf.cast(height, tf.float32), tf.int32)
    half_w = tf.cast(fraction * tf.cast(width, tf.float32), tf.int32)
    y_seed, x_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    center_y = tf.random.stateless_uniform([], y_seed, 0, height, tf.int32)
    center_x = tf.random.stateless_uniform([], x_seed, 0, width, tf.int32)
    inside = _box_mask(height, width, center_y - half_h, center_y + half_h,
                       center_x - half_w, center_x + half_w)
    return tf.where(inside, tf.constant(_GREY, image.dtype), image)


# Model Garden's RandAugment ops, in its order: `layer_choices` indexes this.
OPS = {
    "auto_contrast": auto_contrast, "equalize": equalize, "invert": invert, "rotate": rotate,
    "posterize": posterize, "solarize": solarize, "color": color, "contrast": contrast,
    "brightness": brightness, "sharpness": sharpness, "shear_x": shear_x, "shear_y": shear_y,
    "translate_x": translate_x, "translate_y": translate_y, "cutout": cutout,
    "solarize_add": solarize_add,
}

"""Per-image augmentation ops (`tftrain.data.image_ops`): RandAugment's ops against PIL or a
NumPy reference, its op choice and wiring, random erasing's box and frequency, determinism,
graph mode. Small images, no model."""
import math

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageOps

from tftrain.data import image_ops

SEED = tf.constant([3, 1], tf.int64)


def levels_image(height=16, width=20, channels=3, seed=0, low=0, high=256):
    """A random image of whole levels (k / 255), so quantizing it is exact."""
    rng = np.random.default_rng(seed)
    return (rng.integers(low, high, (height, width, channels)) / 255).astype(np.float32)


def with_pil(image, fn):
    """`fn` applied to the image as a PIL image of 8-bit levels, back as floats."""
    levels = np.round(image * 255).astype(np.uint8)
    pil = Image.fromarray(levels[..., 0] if levels.shape[-1] == 1 else levels)
    out = np.asarray(fn(pil), np.float32) / 255
    return out.reshape(image.shape)


def op(name, image, magnitude, seed=SEED):
    return image_ops.OPS[name](tf.constant(image), magnitude, seed).numpy()


def outcomes(name, image, magnitude, seeds=8):
    """The distinct outputs of an op with a random sign, over `seeds` seeds."""
    outs = [op(name, image, magnitude, tf.constant([s, 5])) for s in range(seeds)]
    return [o for i, o in enumerate(outs) if not any(np.array_equal(o, p) for p in outs[:i])]


@pytest.mark.parametrize("channels, height, width", [(1, 16, 20), (3, 16, 20), (3, 1, 2)])
def test_every_op_keeps_the_shape_dtype_and_range(channels, height, width):
    image = levels_image(height, width, channels)
    for name in image_ops.OPS:
        for magnitude in (0, 10, 30):
            out = op(name, image, magnitude)
            assert out.shape == image.shape and out.dtype == np.float32, name
            assert 0 <= out.min() and out.max() <= 1, (name, magnitude)


def test_no_layers_leave_the_image_unchanged():
    image = levels_image(seed=1) + np.float32(1e-4)  # not whole levels: no quantizing either
    np.testing.assert_array_equal(image_ops.randaugment(image, SEED, 0, 10).numpy(), image)


@pytest.mark.parametrize("name", ["rotate", "shear_x", "shear_y", "translate_x",
                                  "translate_y", "cutout", "solarize_add"])
def test_ops_with_no_effect_at_magnitude_zero_leave_the_image_unchanged(name):
    image = levels_image(seed=2)
    np.testing.assert_array_equal(op(name, image, 0), image)
    assert not np.array_equal(op(name, image, 10), image)


@pytest.mark.parametrize("name", ["color", "contrast", "brightness", "sharpness"])
def test_enhance_ops_leave_the_image_unchanged_at_factor_one(name):
    # Model Garden's factor is level * 1.8 + 0.1: 1.0 at magnitude 5, not at 0.
    image = levels_image(seed=3)
    np.testing.assert_allclose(op(name, image, 5), image, atol=1e-6)
    assert np.abs(op(name, image, 0) - image).max() > 0.05


def test_each_layer_applies_the_op_its_choice_names():
    image = levels_image(seed=4)
    names = list(image_ops.OPS)
    seen = set()
    for seed in range(40):
        seed = tf.constant([seed, 11])
        choices, op_seeds = image_ops.layer_choices(seed, 2)
        expected = image
        for choice, op_seed in zip(choices.numpy(), op_seeds):
            if choice < len(names):
                expected = op(names[choice], expected, 10, op_seed)
            seen.add(int(choice))
        np.testing.assert_array_equal(image_ops.randaugment(image, seed, 2, 10).numpy(),
                                      expected)
    assert len(seen) >= 14


def test_the_op_choice_is_uniform_over_the_16_ops_and_identity():
    draws = 17 * 200
    choices = tf.data.Dataset.range(draws).map(
        lambda i: image_ops.layer_choices(tf.stack([i, tf.constant(9, tf.int64)]), 2)[0])
    choices = choices.batch(draws).get_single_element().numpy()
    counts = np.bincount(choices[:, 0], minlength=17)
    assert counts.size == 17
    chi2 = ((counts - 200) ** 2 / 200).sum()
    assert chi2 < 40, counts  # 16 degrees of freedom: P(chi2 > 40) ~ 0.001
    assert np.mean(choices[:, 0] == choices[:, 1]) < 0.1  # layers draw independently


def test_rotate_by_90_degrees_equals_rot90_either_way():
    image = levels_image(9, 9, seed=5)
    np.testing.assert_array_equal(image_ops._rotate_degrees(image, 90.0).numpy(),
                                  np.rot90(image, 1))
    found = outcomes("rotate", image, 30)  # magnitude 30: level 3, 90 degrees
    assert len(found) == 2
    for out in found:
        assert any(np.array_equal(out, np.rot90(image, k)) for k in (1, 3))


def test_posterize_keeps_int_level_times_4_bits_as_pil():
    image = levels_image(seed=6)
    np.testing.assert_array_equal(op("posterize", image, 5),
                                  with_pil(image, lambda p: ImageOps.posterize(p, 2)))
    np.testing.assert_array_equal(op("posterize", image, 10),
                                  with_pil(image, lambda p: ImageOps.posterize(p, 4)))
    assert not op("posterize", image, 0).any()  # 0 bits, as in Model Garden


def test_solarize_inverts_the_levels_at_or_above_its_threshold_as_pil():
    image = levels_image(seed=7)
    np.testing.assert_allclose(op("solarize", image, 5),  # threshold 128
                               with_pil(image, lambda p: ImageOps.solarize(p, 128)), atol=1e-6)
    np.testing.assert_array_equal(op("solarize", image, 10), image)  # threshold 256


def test_solarize_add_adds_110_levels_below_128():
    image = levels_image(seed=8)
    levels = np.round(image * 255)
    expected = np.where(levels < 128, np.minimum(levels + 110, 255), levels) / 255
    np.testing.assert_allclose(op("solarize_add", image, 10), expected, atol=1e-6)


@pytest.mark.parametrize("channels", [1, 3])
def test_equalize_autocontrast_and_invert_match_pil(channels):
    skewed = (np.round(levels_image(40, 40, channels, seed=9) ** 3 * 255) / 255)
    skewed = skewed.astype(np.float32)
    skewed[:10] = 1.0  # PIL's step leaves the top level's (large) count out
    np.testing.assert_array_equal(op("equalize", skewed, 10),
                                  with_pil(skewed, ImageOps.equalize))
    narrow = levels_image(channels=channels, seed=10, low=40, high=201)
    narrow[..., 0] = 0.4  # a flat channel stays as it is
    np.testing.assert_array_equal(op("auto_contrast", narrow, 10),
                                  with_pil(narrow, ImageOps.autocontrast))
    np.testing.assert_allclose(op("invert", narrow, 10), with_pil(narrow, ImageOps.invert),
                               atol=1e-6)


def test_color_contrast_and_brightness_blend_with_their_degenerate_images():
    image = levels_image(seed=11)
    gray = image @ np.array([0.2989, 0.587, 0.114], np.float32)
    for magnitude in (0, 10, 30):
        factor = magnitude / 10 * 1.8 + 0.1
        blend = lambda degenerate: np.clip(degenerate + factor * (image - degenerate), 0, 1)
        np.testing.assert_allclose(op("color", image, magnitude), blend(gray[..., None]),
                                   atol=2e-5)
        np.testing.assert_allclose(op("contrast", image, magnitude), blend(gray.mean()),
                                   atol=2e-5)
        np.testing.assert_allclose(op("brightness", image, magnitude), blend(0), atol=2e-5)


def test_sharpness_blends_with_pils_smooth_filter_inside_the_border():
    image = levels_image(seed=12)
    kernel = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], np.float32) / 13
    smooth = image.copy()
    for y in range(1, image.shape[0] - 1):
        for x in range(1, image.shape[1] - 1):
            smooth[y, x] = np.tensordot(kernel, image[y - 1:y + 2, x - 1:x + 2], ([0, 1], [0, 1]))
    np.testing.assert_allclose(op("sharpness", image, 10),
                               np.clip(smooth + 1.9 * (image - smooth), 0, 1), atol=2e-5)


@pytest.mark.parametrize("name, axis", [("translate_x", 1), ("translate_y", 0)])
def test_translate_shifts_by_100_224ths_of_the_side_either_way_filling_grey(name, axis):
    image = levels_image(56, 56, seed=13)  # level 4: 0.4 * 100/224 * 56 = 10 pixels
    shifted = []
    for step in (10, -10):
        out = np.full_like(image, 0.5)
        source = np.roll(image, -step, axis=axis)
        keep = slice(0, 56 - step) if step > 0 else slice(-step, 56)
        index = (keep, slice(None)) if axis == 0 else (slice(None), keep)
        out[index] = source[index]
        shifted.append(out)
    found = outcomes(name, image, 4)
    assert len(found) == 2
    for out in found:
        assert any(np.array_equal(out, s) for s in shifted)


def test_shear_x_reads_each_row_shifted_by_its_row_times_the_shear():
    image = levels_image(12, 16, seed=14)
    found = outcomes("shear_x", image, 10)  # shear 0.3, either way
    assert len(found) == 2
    for out in found:
        np.testing.assert_array_equal(out[0], image[0])  # row 0 does not move
        matches = []
        for shear in (0.3, -0.3):
            expected = np.full_like(image, 0.5)
            for y in range(12):
                for x in range(16):
                    position = x + np.float32(shear) * y  # rounded half away from 0
                    source = int(math.copysign(math.floor(abs(position) + 0.5), position))
                    if 0 <= source < 16:
                        expected[y, x] = image[y, source]
            matches.append(np.array_equal(out, expected))
        assert any(matches)


def test_cutout_fills_one_grey_box_of_40_224ths_half_sides():
    image = levels_image(56, 56, seed=15)  # level 10: half-sides int(40/224 * 56) = 10
    sizes = []
    for seed in range(20):
        out = op("cutout", image, 10, tf.constant([seed, 2]))
        changed = np.any(out != image, axis=-1)
        rows, cols = np.flatnonzero(changed.any(1)), np.flatnonzero(changed.any(0))
        assert changed.sum() == len(rows) * len(cols)  # one box
        assert np.all(out[changed] == 0.5)
        assert len(rows) <= 20 and len(cols) <= 20
        sizes.append((len(rows), len(cols)))
    assert (20, 20) in sizes  # unclipped somewhere


def erased_box(out, image):
    """(top, left, height, width) of the one box where `out` differs from `image`, or None."""
    changed = np.any(out != image, axis=-1)
    if not changed.any():
        return None
    rows, cols = np.flatnonzero(changed.any(1)), np.flatnonzero(changed.any(0))
    assert changed.sum() == len(rows) * len(cols), "not one box"
    return rows[0], cols[0], len(rows), len(cols)


@pytest.mark.parametrize("height, width", [(40, 60), (60, 24)])  # boxes too high, too wide
def test_random_erasing_fills_one_box_of_bounded_area_and_aspect_with_noise(height, width):
    image = np.ones((height, width, 3), np.float32)  # uniform noise in [0, 1) is never 1
    areas, aspects = [], []
    for seed in range(60):
        out = image_ops.random_erasing(image, tf.constant([seed, 4]), 1.0).numpy()
        top, left, box_h, box_w = erased_box(out, image)
        assert top + box_h <= height and left + box_w <= width
        noise = out[top:top + box_h, left:left + box_w]
        assert noise.max() < 1 and noise.min() >= 0 and noise.std() > 0.2
        area = box_h * box_w / (height * width)
        slack = (box_h + box_w) / 2 / (height * width)  # rounding each side to whole pixels
        assert 0.02 - slack <= area <= 1 / 3 + slack + 1e-3, (box_h, box_w)
        assert 0.3 <= (box_h + 0.5) / (box_w - 0.5) and (box_h - 0.5) / (box_w + 0.5) <= 1 / 0.3
        areas.append(area)
        aspects.append(box_h / box_w)
    assert min(areas) < 0.08 and max(areas) > (0.25 if width > height else 0.1)
    assert min(aspects) < 0.6 and max(aspects) > 1.6


def test_random_erasing_with_probability_zero_or_no_box_that_fits_leaves_the_image():
    image = levels_image(seed=16)
    np.testing.assert_array_equal(image_ops.random_erasing(image, SEED, 0.0).numpy(), image)
    sliver = levels_image(1, 100, seed=16)  # every candidate box is at least 1 pixel high
    for seed in range(10):
        out = image_ops.random_erasing(sliver, tf.constant([seed, 0]), 1.0)
        np.testing.assert_array_equal(out.numpy(), sliver)


def test_random_erasing_erases_with_its_probability():
    image = tf.ones([10, 12, 1])
    count = 2000
    erased = tf.data.Dataset.range(count).map(lambda i: tf.reduce_any(
        image_ops.random_erasing(image, tf.stack([i, tf.constant(6, tf.int64)]), 0.25) < 1))
    hits = int(np.sum(erased.batch(count).get_single_element().numpy()))
    assert abs(hits / count - 0.25) <= 4 * math.sqrt(0.25 * 0.75 / count), hits


def test_the_same_seed_augments_the_same_way_and_other_seeds_differently():
    image = levels_image(seed=17)

    def run(seed):
        out = image_ops.randaugment(image, tf.constant(seed), 2, 10)
        return image_ops.random_erasing(out, tf.constant(seed), 0.5).numpy()

    np.testing.assert_array_equal(run([1, 2]), run([1, 2]))
    others = [run([1, s]) for s in range(3, 8)]
    assert sum(not np.array_equal(run([1, 2]), o) for o in others) >= 4


def test_in_a_tf_data_map_of_images_of_unknown_size_the_ops_augment_as_eagerly():
    images = [levels_image(12 + s, 20 - s, seed=s) for s in range(4)]
    seeds = tf.constant([[7, s] for s in range(4)], tf.int64)
    data = tf.data.Dataset.from_generator(
        lambda: iter(images), output_signature=tf.TensorSpec([None, None, 3], tf.float32))
    augment = lambda x, seed: image_ops.random_erasing(
        image_ops.randaugment(x, seed, 2, 30), seed, 0.5)
    mapped = tf.data.Dataset.zip((data, tf.data.Dataset.from_tensor_slices(seeds)))
    mapped = mapped.map(augment)
    assert mapped.element_spec.shape.as_list() == [None, None, 3]
    for image, seed, out in zip(images, seeds, mapped):
        assert out.shape == image.shape and out.dtype == tf.float32
        assert 0 <= out.numpy().min() and out.numpy().max() <= 1
        np.testing.assert_array_equal(out.numpy(), augment(image, seed).numpy())


@pytest.mark.parametrize("call, message", [
    (lambda x: image_ops.randaugment(x, SEED, 2, 31), r"magnitude must be in \[0, 30\], got 31"),
    (lambda x: image_ops.randaugment(x, SEED, -1, 10), "num_layers must be an integer >= 0"),
    (lambda x: image_ops.random_erasing(x, SEED, 1.5), r"probability must be in \[0, 1\]"),
    (lambda x: image_ops.randaugment(x[..., :2], SEED, 2, 10), "1 or 3 channels"),
    (lambda x: image_ops.random_erasing(x[0], SEED, 0.5), "1 or 3 channels"),
])
def test_bad_arguments_are_refused_in_one_line(call, message):
    with pytest.raises(ValueError, match=message):
        call(levels_image())

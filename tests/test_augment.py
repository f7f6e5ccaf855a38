"""`data.augment`: the crop's windows, the JPEG window decode, the flip, the stream's seeds
(the same batches after a resume), mixed targets and weights, the evaluation's center crop
(read, exported and served alike), and the one-line refusals of bad settings.

Images are the ImageNet-layout JPEGs of tests/imagenet_layout.py (20..40 pixels a side,
decoded at 24x24) and the embedded digits."""
import io

import numpy as np
import pytest

from tests import imagenet_layout

CROP_FLIP_MIX = {"random_resized_crop": True, "flip": True, "mixup_alpha": 0.2,
                 "cutmix_alpha": 1.0}
EVERYTHING = {**CROP_FLIP_MIX, "randaugment": {"num_layers": 2, "magnitude": 15},
              "random_erasing": 0.5, "switch_prob": 0.3, "mix_prob": 0.8}
FOREIGN = {"pipeline": "image_folder",
           "pipeline_options": {"image_size": imagenet_layout.IMAGE_SIZE},
           "info": {"num_classes": imagenet_layout.NUM_CLASSES}}


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> str:
    """The ImageNet-layout records, written once (read-only)."""
    return imagenet_layout.write(str(tmp_path_factory.mktemp("augment") / "records"))


def _load(records, split="train", batch=8, training=True, **kwargs):
    from tftrain.data import reader

    if training:
        kwargs = {"repeat": True, "seed": 5, **kwargs}
    return reader.load(records, split, batch, training=training, **FOREIGN, **kwargs)


def _batches(dataset, count):
    return [tuple(t.numpy() for t in batch) for batch in dataset.take(count)]


# ---- the ops ----------------------------------------------------------------------------------

def test_random_windows_respect_the_scale_and_ratio_bounds():
    import tensorflow as tf

    from pipelines.images import random_window

    height, width, scale, ratio = 100, 80, (0.25, 0.5), (0.5, 2.0)
    seeds = tf.random.stateless_uniform([400, 2], [1, 2], minval=None, maxval=None,
                                        dtype=tf.int64)
    windows = tf.map_fn(lambda s: tf.stack(random_window([height, width], s, scale, ratio)),
                        seeds, fn_output_signature=tf.int32).numpy()
    top, left, rows, columns = windows.T
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + rows <= height).all() and (left + columns <= width).all()
    whole = (rows == height) & (columns == width)
    assert whole.mean() < 0.05  # the fallback to the whole image is rare at these bounds
    area = rows[~whole] * columns[~whole] / (height * width)
    aspect = columns[~whole] / rows[~whole]
    # integer sides: each rounded by at most half a pixel
    assert area.min() >= scale[0] * 0.95 and area.max() <= scale[1] * 1.05
    assert aspect.min() >= ratio[0] * 0.95 and aspect.max() <= ratio[1] * 1.05
    # the draws use the whole range (an implementation ignoring the bounds fails above or here)
    assert area.min() < 0.3 and area.max() > 0.45
    assert aspect.min() < 0.7 and aspect.max() > 1.5


@pytest.mark.parametrize("subsampling,channels", [(0, 3), (2, 3), (2, 1)],
                         ids=["444_rgb", "420_rgb", "420_gray"])
def test_a_jpeg_window_decode_equals_decode_then_crop(subsampling, channels):
    """Exactly, but for one thing of libjpeg's: with chroma subsampled (4:2:0, most JPEGs) the
    colour of a window's last column, upsampled without its right neighbour, may differ."""
    import tensorflow as tf
    from PIL import Image

    from pipelines.images import decode_window_of

    pixels = np.random.default_rng(3).integers(0, 256, size=(37, 29, 3)).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90, subsampling=subsampling)
    encoded = tf.constant(buffer.getvalue())
    whole = tf.io.decode_jpeg(encoded, channels=channels).numpy()
    exact = slice(None) if subsampling == 0 or channels == 1 else slice(None, -1)
    for top, left, rows, columns in ([5, 3, 20, 17], [0, 0, 16, 16], [1, 2, 30, 25]):
        windowed = decode_window_of(encoded, lambda size: [top, left, rows, columns],
                                    channels).numpy()
        assert windowed.shape == (rows, columns, channels)
        cut = whole[top:top + rows, left:left + columns]
        np.testing.assert_array_equal(windowed[:, exact], cut[:, exact])
        assert not np.array_equal(windowed, whole[top + 1:top + 1 + rows, left:left + columns])


def test_the_flip_mirrors_exactly_the_examples_its_uniforms_say():
    import tensorflow as tf

    from tftrain.data import augment
    from tftrain.data.augment_options import parse

    images = tf.random.stateless_uniform([64, 6, 5, 3], [4, 4])
    stage = augment.Stage(parse({"flip": True}), seed=1, image_shape=(6, 5, 3))
    seed = tf.constant([7, 8], tf.int64)
    flipped = stage.per_image(images, {"flip": seed}, 64).numpy()
    mask = augment.flip_mask(seed, 64).numpy()
    assert 20 <= mask.sum() <= 44  # about half of 64
    np.testing.assert_array_equal(flipped[mask], images.numpy()[mask][:, :, ::-1])
    np.testing.assert_array_equal(flipped[~mask], images.numpy()[~mask])


def test_randaugment_and_erasing_take_each_image_with_its_own_seed():
    import tensorflow as tf

    from tftrain.data import augment, image_ops
    from tftrain.data.augment_options import parse

    images = tf.random.stateless_uniform([6, 12, 10, 3], [5, 5])
    seeds = {"randaugment": tf.constant([1, 2], tf.int64),
             "erasing": tf.constant([3, 4], tf.int64)}
    stage = augment.Stage(parse({"randaugment": {"num_layers": 2, "magnitude": 10},
                                 "random_erasing": 1.0}), seed=1, image_shape=(12, 10, 3))
    out = stage.per_image(images, seeds, 6).numpy()
    layer_seeds = augment.example_seeds(seeds["randaugment"], 6)
    erase_seeds = augment.example_seeds(seeds["erasing"], 6)
    for i in range(6):
        expected = image_ops.random_erasing(
            image_ops.randaugment(images[i], layer_seeds[i], 2, 10), erase_seeds[i], 1.0)
        np.testing.assert_array_equal(out[i], expected.numpy())
        assert np.abs(out[i] - images[i].numpy()).max() > 0.01  # erased: always changed


# ---- the stream ---------------------------------------------------------------------------------

def test_a_batch_is_a_function_of_seed_pipeline_and_position(records):
    """The same records at two positions are augmented differently; at the same position (a
    stream started there), identically; another input pipeline draws its own."""
    import tensorflow as tf

    from pipelines import load_pipeline
    from tftrain.data import augment, reader
    from tftrain.data.augment_options import parse

    serialized = next(iter(_load(records, last_stage="read")))
    options = parse({"random_resized_crop": True, "flip": True})
    pipeline = load_pipeline("image_folder", image_size=24)
    decode = reader.batch_decoder(reader.parse_spec(pipeline.features({})), pipeline, {})

    def augmented(start, pipeline_id=0, count=2):
        stage = augment.Stage(options, 5, (24, 24, 3), None, pipeline_id)
        same = tf.data.Dataset.from_tensors(serialized).repeat(count)
        return [images.numpy() for images, _ in stage.apply(same, start, decode, None, True)]

    at_0, at_1 = augmented(0)
    (again_at_1,) = augmented(1, count=1)
    (other_pipeline_at_1,) = augmented(1, pipeline_id=1, count=1)
    np.testing.assert_array_equal(at_1, again_at_1)
    assert np.abs(at_0 - at_1).max() > 0.1
    assert np.abs(other_pipeline_at_1 - at_1).max() > 0.1


@pytest.mark.parametrize("cache,augment", [
    ("none", CROP_FLIP_MIX), ("decoded", CROP_FLIP_MIX), ("records", EVERYTHING)],
    ids=["crop_flip_mix", "crop_flip_mix_cache_decoded", "everything_cache_records"])
def test_a_resumed_stream_equals_the_uninterrupted_one(records, cache, augment):
    """Crop (JPEG windows; `cache=decoded`: crop_and_resize of the cached images), flip,
    mixup and cutmix, and RandAugment and random erasing: the stream from start_batch=4 is
    batches 4, 5 of the stream from 0."""
    reference = _batches(_load(records, augment=augment, cache=cache), 6)
    resumed = _batches(_load(records, augment=augment, cache=cache, start_batch=4), 2)
    for got, want in zip(resumed, reference[4:]):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    targets = np.concatenate([batch[1] for batch in reference])
    assert targets.shape == (48, imagenet_layout.NUM_CLASSES) and targets.dtype == np.float32
    np.testing.assert_allclose(targets.sum(axis=1), 1.0, atol=1e-6)
    assert ((targets > 0.01) & (targets < 0.99)).any()  # some examples were mixed
    assert all(batch[0].shape == (8, 24, 24, 3) for batch in reference)


def test_class_weights_are_mixed_with_the_targets(records):
    weights_of_class = [0.0, 1.0, 2.0, 5.0]
    for images, targets, weights in _batches(
            _load(records, augment={"mixup_alpha": 1.0}, label_weights=weights_of_class), 3):
        np.testing.assert_allclose(weights, targets @ np.array(weights_of_class), atol=1e-5)
    assert not np.allclose(weights, np.round(weights))  # mixed, not one class's weight


# ---- evaluation: the center crop, wherever the model sees non-training images ----------------

def test_evaluation_decodes_the_center_crop_of_each_image(records):
    import tensorflow as tf

    from tftrain.data import reader

    serialized = next(iter(reader.load(records, "validation", 6, training=False, **FOREIGN,
                                       last_stage="read"))).numpy()
    (images, labels), = _batches(_load(records, "validation", 6, training=False,
                                       augment={"random_resized_crop": {"eval_crop": 0.75}}), 1)
    for image, record in zip(images, serialized):
        example = tf.train.Example.FromString(record)
        pixels = tf.io.decode_jpeg(example.features.feature["image/encoded"].bytes_list.value[0],
                                   channels=3).numpy()
        height, width = pixels.shape[:2]
        side = int(0.75 * min(height, width))
        top, left = (height - side + 1) // 2, (width - side + 1) // 2
        expected = tf.image.resize(pixels[top:top + side, left:left + side].astype(np.float32),
                                   [24, 24]).numpy() / 255.0
        # the last 2 columns sample the window's last one: its colour may differ (4:2:0
        # chroma, see the test above)
        np.testing.assert_allclose(image[:, :-2], expected[:, :-2], atol=1e-6)
        assert np.abs(image - expected).mean() < 1e-3
    plain = _batches(_load(records, "validation", 6, training=False), 1)[0][0]
    assert np.abs(plain - images).max() > 0.1  # without the crop: resize_with_pad


def test_raw_pixels_are_center_cropped_as_encoded_ones(digits_dir, tmp_path):
    """Digits stored as raw pixels (one batched slice and resize) and as PNGs (per image)."""
    from pipelines import load_pipeline
    from tftrain.data import reader
    from tftrain.data.writer import write_dataset

    raw_dir = str(tmp_path / "raw")
    write_dataset(load_pipeline("digits", image_encoding="raw"), "", raw_dir, progress=False)
    crop = {"random_resized_crop": True}
    read = [next(iter(reader.load(d, "test", 32, training=False, augment=crop)))[0].numpy()
            for d in (raw_dir, digits_dir)]
    np.testing.assert_allclose(read[0], read[1], atol=1e-6)
    plain = next(iter(reader.load(raw_dir, "test", 32, training=False)))[0].numpy()
    assert np.abs(plain - read[0]).max() > 0.1


def test_the_export_serves_what_validation_saw(records, tmp_path, cli):
    """A run trained with random_resized_crop: its export's `serving_examples` on raw
    validation records gives the logits of the model on the validation decode."""
    import tensorflow as tf

    from tftrain.engine.export import saved_model_dir
    from tftrain.optimize.predict import read_run

    run = tmp_path / "run"
    augment = "{random_resized_crop: true, flip: true}"
    assert cli("train", "--config=digits", f"--model_dir={run}", "--params_override="
               + imagenet_layout.overrides(records, **{
                   "data.batch_size": 8, "train.steps": 3, "train.epochs": 1,
                   "model.params": "{filters: [4], dense_units: 8}",
                   "data.augment": augment})) == 0
    loaded = tf.saved_model.load(saved_model_dir(str(run / "export")))
    serialized = next(iter(_load(records, "validation", 8, training=False, last_stage="read")))
    served = loaded.signatures["serving_examples"](examples=serialized)["logits"].numpy()
    images, _ = next(iter(_load(records, "validation", 8, training=False,
                                augment={"random_resized_crop": True})))
    (logits,) = loaded.signatures["serving_default"](images).values()
    np.testing.assert_allclose(served, logits.numpy(), atol=1e-6)
    plain, _ = next(iter(_load(records, "validation", 8, training=False)))
    (uncropped,) = loaded.signatures["serving_default"](plain).values()
    assert np.abs(uncropped.numpy() - served).max() > 1e-4  # the crop changes what it sees
    # predict's .tflite path decodes with the run's info: the same center crop
    _, manifest, _ = read_run(str(run))
    assert manifest["info"]["eval_crop"] == 0.875


# ---- bad settings: one line each, before any training -----------------------------------------

@pytest.mark.parametrize("setting,message", [
    ("{flipp: true}", "data.augment has no option 'flipp': did you mean 'flip'? valid: "
                      "random_resized_crop, flip, randaugment, random_erasing, mixup_alpha, "
                      "cutmix_alpha, switch_prob, mix_prob"),
    ("{random_resized_crop: {scale: [0, 1]}}",
     "data.augment.random_resized_crop.scale=[0.0, 1.0] must lie in (0, 1]"),
    ("{random_resized_crop: {scale: [0.5, 0.2]}}",
     "data.augment.random_resized_crop.scale=[0.5, 0.2]: low must be <= high"),
    ("{random_resized_crop: {ratio: [-1, 2]}}",
     "data.augment.random_resized_crop.ratio=[-1.0, 2.0] must be > 0"),
    ("{random_resized_crop: {sale: [0.1, 1]}}",
     "data.augment.random_resized_crop has no option 'sale': did you mean 'scale'?"),
    ("{random_erasing: 1.5}", "data.augment.random_erasing must be a number in [0, 1], got 1.5"),
    ("{mixup_alpha: -0.2}", "data.augment.mixup_alpha must be a number >= 0, got -0.2"),
    ("{mix_prob: 2}", "data.augment.mix_prob must be a number in [0, 1], got 2"),
    ("{randaugment: {num_layers: 11}}",
     "data.augment.randaugment.num_layers must be an integer in [0, 10], got 11"),
    ("{randaugment: {magnitude: 31}}",
     "data.augment.randaugment.magnitude must be a number in [0, 30], got 31"),
])
def test_bad_settings_are_one_line(setting, message, tmp_path, cli, capsys):
    assert cli("train", "--config=digits", f"--model_dir={tmp_path / 'run'}",
               f"--params_override=data.augment={setting}") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tftrain train: error: {message}"), lines


def test_mixing_a_regression_is_refused(tmp_path, cli, capsys):
    assert cli("train", "--config=diabetes", f"--model_dir={tmp_path / 'run'}",
               "--params_override=task.type=regression,data.augment.mixup_alpha=0.2") == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "tftrain train: error: data.augment's mixup_alpha/cutmix_alpha mix class labels into "
        "soft targets, and task.type=regression has no classes to mix: set them to 0")


def test_augmenting_a_pipeline_that_decodes_no_images_is_refused(text_dir, tmp_path, cli,
                                                                  capsys):
    assert cli("train", "--config=text_lm", f"--model_dir={tmp_path / 'run'}",
               f"--params_override=data.dir={text_dir},data.augment.flip=true") == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "tftrain train: error: data.augment transforms images, and pipeline 'text' does not "
        "decode images (pipelines.images.decode_image_batch): remove data.augment")


def test_mixing_is_refused_for_a_task_the_dataset_makes_regression():
    """task.type=auto resolved from the dataset's float label: refused once it is known."""
    from tftrain import config as config_lib
    from tftrain import tasks
    from tftrain.errors import ConfigError

    config = config_lib.build_config("digits", overrides="data.augment.cutmix_alpha=1.0")
    floats = {"pipeline": "csv", "info": {"label": {"type": "float"},
                                          "label_stats": {"kind": "float", "shape": []}}}
    with pytest.raises(ConfigError) as refused:
        tasks.from_config(config, floats)
    assert str(refused.value) == (
        "data.augment's mixup_alpha/cutmix_alpha mix class labels into soft targets, and "
        "task.type=regression (from the dataset's label) has no classes to mix: set them to 0")

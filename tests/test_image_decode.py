"""Batch image decoding: exact pixels when stored at the training size, resize otherwise."""
import io

import numpy as np
import tensorflow as tf
from PIL import Image

from pipelines.images import decode_image_batch


def _png(array):
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def _features(arrays):
    return {"image/encoded": tf.constant([_png(a) for a in arrays]),
            "image/height": tf.constant([a.shape[0] for a in arrays], tf.int64),
            "image/width": tf.constant([a.shape[1] for a in arrays], tf.int64),
            "image/class/label": tf.constant(list(range(len(arrays))), tf.int64)}


def test_stored_at_size_decodes_exact_pixels():
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, (6, 5, 3), dtype=np.uint8) for _ in range(4)]
    images, labels = decode_image_batch(_features(arrays), 6, 5, 3)
    np.testing.assert_allclose(images.numpy(), np.stack(arrays) / 255.0, atol=1e-6)
    assert labels.dtype == tf.int32 and labels.numpy().tolist() == [0, 1, 2, 3]


def test_other_sizes_are_resized_with_padding():
    arrays = [np.full((4, 8, 3), 255, np.uint8), np.full((6, 5, 3), 255, np.uint8)]
    images, _ = decode_image_batch(_features(arrays), 6, 5, 3)
    assert images.shape == (2, 6, 5, 3)
    assert images.numpy()[1].min() == 1.0  # already 6x5: unchanged
    assert images.numpy()[0].min() == 0.0 and images.numpy()[0].max() == 1.0  # 4x8: padded

"""Image features with the standard TF keys, shared by the image pipelines.

Keys: image/encoded, image/format, image/height, image/width, image/class/label,
image/class/text, image/filename — the layout other TF tooling (TFDS, Model Garden, TF Object
Detection) reads, so the shards interoperate.
"""
from __future__ import annotations

IMAGE_FEATURES = {
    "image/encoded": {"dtype": "string", "shape": []},
    "image/format": {"dtype": "string", "shape": []},
    "image/height": {"dtype": "int64", "shape": []},
    "image/width": {"dtype": "int64", "shape": []},
    "image/class/label": {"dtype": "int64", "shape": []},
    "image/class/text": {"dtype": "string", "shape": []},
    "image/filename": {"dtype": "string", "shape": []},
}


def image_example(*, encoded: bytes, image_format: str, height: int, width: int, label: int,
                  text: str, filename: str):
    """A `tf.train.Example` with the standard image keys."""
    import tensorflow as tf

    def _bytes(value: bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def _int(value: int):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    return tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": _bytes(encoded),
        "image/format": _bytes(image_format.encode()),
        "image/height": _int(height),
        "image/width": _int(width),
        "image/class/label": _int(label),
        "image/class/text": _bytes(text.encode()),
        "image/filename": _bytes(filename.encode()),
    }))


def decode_image_batch(features: dict, height: int, width: int, channels: int):
    """Decodes a batch of encoded images to float32 in [0, 1], resized to height x width.

    Returns `(images, labels)` with images shaped [batch, height, width, channels] and int32
    labels. Decoding runs per image (JPEG/PNG are per-image formats) in a vectorized map.
    """
    import tensorflow as tf

    def decode_one(encoded):
        image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        image = tf.image.resize_with_pad(tf.cast(image, tf.float32), height, width)
        return image / 255.0

    images = tf.map_fn(decode_one, features["image/encoded"],
                       fn_output_signature=tf.TensorSpec([height, width, channels], tf.float32))
    labels = tf.cast(features["image/class/label"], tf.int32)
    return images, labels

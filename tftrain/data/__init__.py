"""TFRecord datasets: the manifest, the writer (`tftrain convert`) and the reader (`load`)."""


def load(*args, **kwargs):
    """Returns a batched `tf.data.Dataset` of `(inputs, label)`; see `tftrain.data.reader.load`."""
    from tftrain.data import reader  # imports TensorFlow; keep `import tftrain.data` light

    return reader.load(*args, **kwargs)

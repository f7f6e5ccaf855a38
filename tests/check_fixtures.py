"""What `tftrain check` must catch: a model XLA cannot compile, a pipeline that calls Python.

model.name=tests.check_fixtures:py_function_model — a Lambda layer whose `tf.py_function`
(op EagerPyFunc) has no XLA kernel: `jit_compile=True` fails on the CPU as on a TPU.
data.pipeline=tests.check_fixtures — the digits data, decoded through `tf.py_function`: fine
on a TPU VM, impossible on a TPU node's hosts or a tf.data service worker.
"""
from pipelines import digits


def py_function_model(input_shape, num_classes, units=16):
    """Flatten -> Dense -> Lambda(tf.py_function) named 'python_step' -> logits."""
    import tensorflow as tf
    import tf_keras as keras

    def python_step(x):
        y = tf.py_function(lambda t: t * 1.0, [x], tf.float32)
        y.set_shape(x.shape)
        return y

    inputs = keras.Input(input_shape)
    x = keras.layers.Dense(units, activation="relu")(keras.layers.Flatten()(inputs))
    x = keras.layers.Lambda(python_step, name="python_step")(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="py_function_model")


class Pipeline(digits.Pipeline):
    """The digits pipeline whose decode runs the images through Python."""

    def decode(self, features, info):
        images, labels = super().decode(features, info)
        return scale_in_python(images), labels


def scale_in_python(images):
    """Multiplies by 1 in NumPy, through tf.py_function (what a user's custom decode might do)."""
    import tensorflow as tf

    out = tf.py_function(lambda t: t.numpy() * 1.0, [images], tf.float32)
    out.set_shape(images.shape)
    return out

"""R², the coefficient of determination, as a streaming Keras metric (regression's `r2`).

Kept from sums (count, Σy, Σy², Σ(y - ŷ)²) per output, so it is exact over a whole epoch and
merges across replicas like any Keras metric; labels are reshaped to the predictions' shape
(a scalar label against a one-unit output). Registered with Keras: import this module before
loading a SavedModel of a regression run (`tftrain.optimize.evaluate` and `tftrain.optimize.runs` do).
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras as keras


@keras.saving.register_keras_serializable(package="tftrain")
class R2(keras.metrics.Metric):
    """1 - SSE/SST per output, averaged over outputs (scikit-learn's `r2_score`)."""

    def __init__(self, size: int = 1, name: str = "r2", dtype=None, **kwargs):
        super().__init__(name=name, dtype=dtype, **kwargs)
        self.size = size

        def add(weight_name):
            return self.add_weight(name=weight_name, shape=(size,), initializer="zeros")

        self._sums = [add("count"), add("sum"), add("sum_of_squares"), add("squared_errors")]

    # No branch on a tensor: AutoGraph, which Keras applies to these, would only spend CPU.
    @tf.autograph.experimental.do_not_convert
    def update_state(self, y_true, y_pred, sample_weight=None):
        y_pred = tf.cast(y_pred, self.dtype)
        y_pred = tf.reshape(y_pred, [tf.shape(y_pred)[0], self.size])
        y_true = tf.reshape(tf.cast(y_true, self.dtype), tf.shape(y_pred))
        weight = tf.ones_like(y_true) if sample_weight is None else tf.broadcast_to(
            tf.reshape(tf.cast(sample_weight, self.dtype), [-1, 1]), tf.shape(y_true))
        count, total, squares, errors = self._sums
        updates = [count.assign_add(tf.reduce_sum(weight, 0)),
                   total.assign_add(tf.reduce_sum(weight * y_true, 0)),
                   squares.assign_add(tf.reduce_sum(weight * y_true ** 2, 0)),
                   errors.assign_add(tf.reduce_sum(weight * (y_true - y_pred) ** 2, 0))]
        return tf.group(updates)

    @tf.autograph.experimental.do_not_convert
    def result(self):
        count, total, squares, errors = self._sums
        spread = squares - total ** 2 / tf.maximum(count, 1.0)
        return tf.reduce_mean(1.0 - tf.math.divide_no_nan(errors, spread))

    def reset_state(self):
        for variable in self._sums:
            variable.assign(tf.zeros_like(variable))

    def get_config(self):
        return {**super().get_config(), "size": self.size}

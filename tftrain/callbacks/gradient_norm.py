"""The gradient's global norm in every run: `grad_norm` in each step's logs (the progress
lines, the divergence guard) and in TensorBoard (`gradients/norm` every step,
`gradients/clipped_fraction` at epoch ends), from the variables the optimizer writes at each
update (`training.gradients`)."""
from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from tftrain.training import gradients


class GradientNormLog(keras.callbacks.Callback):
    """Adds the last update's global gradient norm to each step's logs as `grad_norm`.

    Put it before the callbacks that read it (the divergence guard, the progress lines). With
    `steps_per_execution` N > 1 it sees every Nth step's norm (the largest and the clipped
    count are the optimizer's, over every update). `log_dir`: where the scalars go (None: no
    TensorBoard, e.g. a worker that is not the chief).
    """

    def __init__(self, log_dir: str | None = None):
        super().__init__()
        self._supports_tf_logs = True
        self.log_dir = log_dir
        self._writer = None
        self._measured = None

    def on_train_begin(self, logs=None):
        self._measured = gradients.measuring(self.model.optimizer)
        if self.log_dir and self._measured is not None and self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_train_batch_end(self, batch, logs=None):
        measured = self._measured
        if measured is None or measured.gradient_norm is None or logs is None:
            return
        norm = float(measured.gradient_norm.numpy())
        logs["grad_norm"] = norm
        if self._writer is not None:
            with self._writer.as_default(step=int(measured.iterations.numpy())):
                tf.summary.scalar("gradients/norm", norm)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:  # a step's value, not the epoch's: kept out of history and curves
            logs.pop("grad_norm", None)
        if self._writer is None:
            return
        stats = gradients.summary(self.model.optimizer)
        with self._writer.as_default(step=int(self._measured.iterations.numpy())):
            tf.summary.scalar("gradients/clipped_fraction", stats["clipped_fraction"])
            tf.summary.scalar("gradients/max_norm", stats["max_norm"])
        self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None

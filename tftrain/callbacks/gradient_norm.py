"""The gradient's global norm in every run: `grad_norm` in each step's logs (the progress
lines, the divergence guard) and in TensorBoard (`gradients/norm` every step,
`gradients/clipped_fraction` at epoch ends), from the variables the optimizer writes at each
update (`training.gradients`)."""
from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from tftrain.training import gradients


WRITE_EVERY = 100  # steps whose norms are written to TensorBoard at once (and at epoch ends)


class GradientNormLog(keras.callbacks.Callback):
    """Adds the last update's global gradient norm to each step's logs as `grad_norm`.

    Put it before the callbacks that read it (the divergence guard, the progress lines). With
    `steps_per_execution` N > 1 it sees every Nth step's norm (the largest and the clipped
    count are the optimizer's, over every update). `log_dir`: where the scalars go (None: no
    TensorBoard, e.g. a worker that is not the chief), written every `WRITE_EVERY` steps and
    at each epoch end: one variable read is what a step pays.
    """

    def __init__(self, log_dir: str | None = None, steps_per_execution: int = 1):
        super().__init__()
        self._supports_tf_logs = True
        self.log_dir = log_dir
        self._per_call = steps_per_execution  # steps between two on_train_batch_end calls
        self._writer = None
        self._measured = None
        self._step = 0
        self._pending = []  # (step, norm) not yet written: TensorBoard gets them in groups

    def on_train_begin(self, logs=None):
        self._measured = gradients.measuring(self.model.optimizer)
        if self._measured is None:
            return
        self._step = int(self._measured.iterations.numpy())
        if self.log_dir and self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_train_batch_end(self, batch, logs=None):
        measured = self._measured
        if measured is None or measured.gradient_norm is None or logs is None:
            return
        norm = float(measured.gradient_norm.numpy())  # the one read a step costs
        logs["grad_norm"] = norm
        self._step += self._per_call  # counted here: the optimizer's own count is another read
        if self._writer is not None:
            self._pending.append((self._step, norm))
            if len(self._pending) >= WRITE_EVERY:
                self._write()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:  # a step's value, not the epoch's: kept out of history and curves
            logs.pop("grad_norm", None)
        if self._measured is None:
            return
        self._step = int(self._measured.iterations.numpy())  # a rollback may have lowered it
        if self._writer is None:
            return
        self._write()
        stats = gradients.summary(self.model.optimizer)
        with self._writer.as_default(step=self._step):
            tf.summary.scalar("gradients/clipped_fraction", stats["clipped_fraction"])
            tf.summary.scalar("gradients/max_norm", stats["max_norm"])
        self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._write()
            self._writer.close()
            self._writer = None

    def _write(self) -> None:
        """The pending steps' norms into TensorBoard, each at its step."""
        with self._writer.as_default():
            for step, norm in self._pending:
                tf.summary.scalar("gradients/norm", norm, step=step)
        self._pending = []

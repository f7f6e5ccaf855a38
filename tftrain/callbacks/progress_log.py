"""Progress that speaks without a TTY: a line every `train.log_every_steps` steps (default:
about every 30 seconds of training) naming the step, the loss, the gradients' global norm,
examples/s, the model FLOPs utilization (MFU, when the devices' peak is known) and the time
left, and the same scalars in TensorBoard at the same steps.

Keras prints one line per epoch when stdout is not a terminal (a SLURM or Kubernetes job,
`nohup`, CI), so on a large dataset nothing would be said until an epoch ends. The terminal's
progress bar is left as it is: lines are written only when stdout is not a TTY, the scalars
always.
"""
from __future__ import annotations

import time

import tensorflow as tf
import tf_keras as keras
from absl import logging

DEFAULT_SECONDS = 30.0


class ProgressLog(keras.callbacks.Callback):
    """Logs `step N/TOTAL`, the loss, examples/s, MFU (`utilization`) and the ETA every
    `every_steps` steps (0: every `every_seconds` of training); writes `progress/loss`,
    `progress/examples_per_second` and `progress/mfu` to TensorBoard (`log_dir`) at the same
    steps."""

    def __init__(self, total_steps: int, examples_per_step: int, every_steps: int = 0, *,
                 steps_per_execution: int = 1, log_dir: str | None = None, lines: bool = True,
                 every_seconds: float = DEFAULT_SECONDS, utilization=None):
        super().__init__()
        self._supports_tf_logs = True  # the loss is read only when a line is due
        self.total_steps, self.examples_per_step = total_steps, examples_per_step
        self.every_steps, self.every_seconds = every_steps, every_seconds
        self.log_dir, self.lines = log_dir, lines
        self._per_call = steps_per_execution  # steps between two on_train_batch_end calls
        self.utilization = utilization  # engine.utilization.Utilization, or None
        self._writer = None

    def on_train_begin(self, logs=None):
        self._last_step = self._step = int(self.model.optimizer.iterations.numpy())
        self._last_time = time.monotonic()
        if self.log_dir and self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_train_batch_end(self, batch, logs=None):
        self._step += self._per_call  # counted here: reading the optimizer's step is a sync
        elapsed = time.monotonic() - self._last_time
        due = (self._step - self._last_step >= self.every_steps if self.every_steps
               else elapsed >= self.every_seconds)
        if due and logs and "loss" in logs:
            norm = logs.get("grad_norm")  # `callbacks.gradient_norm`, when it runs before
            self._report(float(logs["loss"]), elapsed, None if norm is None else float(norm))

    def _report(self, loss: float, elapsed: float, grad_norm: float | None = None) -> None:
        step = self._step = int(self.model.optimizer.iterations.numpy())
        rate = (step - self._last_step) * self.examples_per_step / max(elapsed, 1e-9)
        left = max(0, self.total_steps - step) * self.examples_per_step / max(rate, 1e-9)
        self._last_step, self._last_time = step, time.monotonic()
        mfu = self.utilization.mfu(rate) if self.utilization else None
        if self.lines:
            logging.info("step %d/%d loss=%.4f%s %s examples/s%s ETA %s", step,
                         self.total_steps, loss,
                         f" grad_norm={grad_norm:.4g}" if grad_norm is not None else "",
                         f"{rate:,.0f}", f" mfu={100 * mfu:.2f}%" if mfu is not None else "",
                         duration(left))
        if self._writer is not None:
            with self._writer.as_default(step=step):
                tf.summary.scalar("progress/loss", loss)
                tf.summary.scalar("progress/examples_per_second", rate)
                if mfu is not None:
                    tf.summary.scalar("progress/mfu", mfu)
            self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def duration(seconds: float) -> str:
    """`1h02m`, `3m12s` or `45s`."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"

"""Heartbeat: where training is, written to a file at most once a second, for a watcher.

`tftrain launch --hang_timeout` gives each worker its own file in `TFTRAIN_HEARTBEAT_FILE`;
while `fit` trains or validates, this callback rewrites it (atomically) with the position, e.g.
"epoch 3 step 12" or "epoch 3 validation step 4". The launcher counts a changed file as progress,
so a long epoch that prints nothing is not mistaken for a hang. Without the variable, no
callback is added.
"""
from __future__ import annotations

import os
import time
from typing import Optional

import tf_keras as keras

from tftrain.fileio import write_atomic
from tftrain.runtime.launch import HEARTBEAT_ENV

MIN_SECONDS = 1.0  # between two writes: a step is often much shorter than a file write


class Heartbeat(keras.callbacks.Callback):
    """Writes the epoch and step of `fit` to `path`, at most every `min_seconds` seconds.

    Args:
      path: the file to rewrite (local or any tf.io.gfile path).
      min_seconds: the least time between two writes.
    """

    def __init__(self, path: str, min_seconds: float = MIN_SECONDS):
        super().__init__()
        self._supports_tf_logs = True  # never converts the logs: no device sync per step
        self.path = path
        self.min_seconds = min_seconds
        self._epoch = 0
        self._written_at = None

    @classmethod
    def from_env(cls) -> Optional["Heartbeat"]:
        """The heartbeat `tftrain launch` asked for, or None outside a watched launch."""
        path = os.environ.get(HEARTBEAT_ENV, "")
        return cls(path) if path else None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._beat(f"epoch {epoch + 1} step 0", force=True)

    def on_train_batch_end(self, batch, logs=None):
        self._beat(f"epoch {self._epoch + 1} step {batch + 1}")

    def on_test_batch_end(self, batch, logs=None):
        self._beat(f"epoch {self._epoch + 1} validation step {batch + 1}")

    def _beat(self, where: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or self._written_at is None or now - self._written_at >= self.min_seconds:
            write_atomic(self.path, where + "\n")
            self._written_at = now

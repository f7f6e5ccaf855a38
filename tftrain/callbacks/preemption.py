"""Preemption: on SIGTERM, back up at the next step boundary and exit with code 143.

`tf.distribute.experimental.PreemptionCheckpointHandler` supports MultiWorkerMirrored only, so
tftrain handles SIGTERM itself, for every strategy. While `fit` runs, the signal only sets a
flag; the next `on_train_batch_end` (or epoch end, or the end of `fit`) writes the backup
through the `Backup` callback and raises `Preempted`, which the CLI turns
into exit code 143 (`PREEMPTED_EXIT_CODE`, 128 + SIGTERM as shells report it). A signal
after an epoch's last step or during its validation waits for the epoch's end: a backup taken
there would resume at the next epoch, and the epoch's validation and end (early stopping, the
plateau, the best checkpoint, its curves) would be lost; `train.validation_steps` bounds that
wait. Outside `fit` (data conversion,
final evaluation, export) the signal raises `Preempted` at once: the backup of the last epoch is
already on disk. Running the same command again resumes.
"""
from __future__ import annotations

import signal
import threading

import tf_keras as keras
from absl import logging

from tftrain.errors import TftrainError

PREEMPTED_EXIT_CODE = 143


class Preempted(TftrainError):
    """The run received SIGTERM; its state is backed up and the same command resumes it."""

    exit_code = PREEMPTED_EXIT_CODE


class SigtermHandler:
    """A context manager that turns SIGTERM into `Preempted` (deferred while `fit` steps)."""

    def __init__(self):
        self.received = False
        self.deferred = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, exc_type, exc, traceback):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
        if exc is None and self.received:
            # The Preempted raised at the signal was swallowed by a broad `except` on the way.
            raise Preempted("stopped by SIGTERM; run the same command again to resume")
        preempted = _preempted_in_chain(exc)
        if preempted is not None and preempted is not exc:
            # Raised from the handler inside C code (TensorFlow tracing an export), Python can
            # report it as a SystemError whose context is the Preempted: it is the Preempted.
            raise preempted from None
        return False

    def _handle(self, signum, frame):
        self.received = True
        logging.warning("SIGTERM received: %s", "backing up at the next step" if self.deferred
                        else "exiting (the last backup is on disk)")
        if not self.deferred:
            raise Preempted("stopped by SIGTERM; run the same command again to resume")


def _preempted_in_chain(error: BaseException | None) -> Preempted | None:
    """The `Preempted` among `error` and the exceptions it was raised from or during."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, Preempted):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


class PreemptionCallback(keras.callbacks.Callback):
    """Defers SIGTERM during `fit`; backs up through `backup` and raises `Preempted` on it."""

    def __init__(self, handler: SigtermHandler, backup):
        super().__init__()
        self._supports_tf_logs = True  # never converts the logs: no device sync per step
        self.handler = handler
        self.backup = backup

    def on_train_begin(self, logs=None):
        self.handler.deferred = True

    def on_train_end(self, logs=None):
        self.handler.deferred = False
        self._check()  # a SIGTERM after the last step: stop before the evaluation and export

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 < (self.params.get("steps") or batch + 2):  # the epoch's last: at its end
            self._check()

    def on_epoch_end(self, epoch, logs=None):
        self._check()  # a SIGTERM during the epoch's end: stop before the next epoch starts

    def _check(self):
        if self.handler.received:
            self.handler.deferred = False
            self.backup.back_up_now()
            self.backup.wait()  # whole on disk before the process exits
            epoch, step = self.backup._current_epoch, int(
                self.backup._training_state._ckpt_saved_batch.numpy()) + 1
            logging.warning("preempted: backed up at epoch %d step %d in %s", epoch + 1, step,
                            self.backup.backup_dir)
            raise Preempted(f"stopped by SIGTERM at epoch {epoch + 1} step {step}; the state is "
                            f"backed up in {self.backup.backup_dir}: run the same command again "
                            "to resume")

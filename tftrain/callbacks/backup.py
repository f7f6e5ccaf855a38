"""Automatic resume: `BackupAndRestore` in `run_dir/backup/`, saved every N steps and per epoch.

A run killed at any moment and started again with the same command restores the weights,
the optimizer (and with it the learning-rate schedule) and the epoch and step counters from the
last backup, and logs "resumed from epoch X step Y". The data iterator is not part of the
backup: a resumed epoch reads its data from the start of a freshly shuffled pass.

Differences from the stock callback: the backup is also written at every epoch end (after
validation), so a run killed between epochs or after its last epoch resumes with no step
repeated; `every_steps` counts steps even with `steps_per_execution > 1`; the backup is kept
when `fit` returns (the run deletes it once summary.json is written, so a kill during the
final evaluation or export does not restart training).
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras as keras
from absl import logging


class Backup(keras.callbacks.BackupAndRestore):
    """`BackupAndRestore(backup_dir)` that backs up every `every_steps` steps (0: epochs only)."""

    def __init__(self, backup_dir: str, every_steps: int = 0):
        super().__init__(backup_dir, save_freq=every_steps or "epoch", delete_checkpoint=False)
        # The stock list leaves out OneDeviceStrategy, which checkpoints like no strategy at all.
        self._supported_strategies += (tf.distribute.OneDeviceStrategy,)
        self.every_steps = every_steps
        self._steps_since_backup = 0
        self._first_step = 0
        self.resumed_at = None  # (epoch, step) when this run continued a backup

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        state = self._training_state
        epoch, batch = int(state._ckpt_saved_epoch.numpy()), int(state._ckpt_saved_batch.numpy())
        if epoch < 0:
            return
        steps = self.params.get("steps")
        if isinstance(self.save_freq, int) and batch >= 0 and batch != (steps or 0) - 1:
            self.resumed_at = (epoch, batch + 1)
        else:
            self.resumed_at = (epoch + 1, 0)
        logging.info("resumed from epoch %d step %d (backup in %s)", self.resumed_at[0] + 1,
                     self.resumed_at[1], self.backup_dir)

    def on_train_batch_begin(self, batch, logs=None):
        self._first_step = batch

    def on_train_batch_end(self, batch, logs=None):
        # `batch` is the last step of the execution; record it (the stock callback records the
        # first one, which repeats steps on resume when steps_per_execution > 1).
        self._training_state._ckpt_saved_batch.assign(batch)
        self._steps_since_backup += batch - self._first_step + 1
        if self.every_steps and self._steps_since_backup >= self.every_steps:
            self.back_up_now()

    def on_epoch_end(self, epoch, logs=None):
        steps = self.params.get("steps")
        if steps:
            self._training_state._ckpt_saved_batch.assign(steps - 1)
        self.back_up_now()

    def back_up_now(self) -> None:
        """Writes the backup of the current state (epoch and last finished step)."""
        self._training_state.back_up(epoch=self._current_epoch)
        self._steps_since_backup = 0

"""Automatic resume: `BackupAndRestore` in `run_dir/backup/`, saved every N steps and per epoch.

A run killed at any moment and started again with the same command restores the weights,
the optimizer (and with it the learning-rate schedule) and the epoch and step counters from the
last backup, and logs "resumed from epoch X step Y". The data iterator is not part of the
backup: the training order is a function of the seed (`tftrain.data.order`), and `steps_done`
tells the input pipeline how many steps to skip, so a resumed run reads the batches the
uninterrupted run would have read next. `trackables` (e.g. the random generators of
`train.deterministic`) are saved and restored with the backup.

Differences from the stock callback: the backup is also written at every epoch end (after
validation), so a run killed between epochs or after its last epoch resumes with no step
repeated; `every_steps` counts steps even with `steps_per_execution > 1`; the backup is kept
when `fit` returns (the run deletes it once summary.json is written, so a kill during the
final evaluation or export does not restart training); the backup also holds the callbacks'
counters (`state`, see `callback_state`), and `checks` can refuse to back up a bad state
(the divergence guard refuses NaN weights).
"""
from __future__ import annotations

import posixpath

import tensorflow as tf
import tf_keras as keras
from absl import logging


class Backup(keras.callbacks.BackupAndRestore):
    """`BackupAndRestore(backup_dir)` that backs up every `every_steps` steps (0: epochs only)."""

    def __init__(self, backup_dir: str, every_steps: int = 0):
        # An int save_freq (whatever it is: `every_steps` sets the cadence here) makes Keras
        # resume at the step after a mid-epoch backup; with "epoch" it would skip the rest of
        # the epoch after a SIGTERM backup.
        super().__init__(backup_dir, save_freq=every_steps or 1, delete_checkpoint=False)
        # The stock list leaves out OneDeviceStrategy, which checkpoints like no strategy at all.
        self._supported_strategies += (tf.distribute.OneDeviceStrategy,)
        self.every_steps = every_steps
        self._steps_since_backup = 0
        self._first_step = 0
        self.resumed_at = None  # (epoch, step) when this run continued a backup
        self.state = None  # callback_state.CallbackState: the callbacks' counters, in the backup
        self.checks = []  # callables run before each backup; one returning False cancels it
        self.back_up_at_start = False  # a backup before the first step (a rollback point)
        self.trackables = {}  # name -> trackable saved with every backup (e.g. random generators)

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if self.state is not None:
            self.trackables["callback_state"] = self.state.trackable
        self._restore_trackables()
        if self.state is not None and not self.state.load() and (
                self._training_state.read_checkpoint_manager.latest_checkpoint):
            logging.info("the backup holds no callback state: their counters start afresh")
        state = self._training_state
        epoch, batch = int(state._ckpt_saved_epoch.numpy()), int(state._ckpt_saved_batch.numpy())
        if epoch < 0:
            if self.back_up_at_start:
                self.back_up_now()
            return
        steps = self.params.get("steps")
        self.resumed_at = resume_point(epoch, batch, steps or 0)
        logging.info("resumed from epoch %d step %d (backup in %s)", self.resumed_at[0] + 1,
                     self.resumed_at[1], self.backup_dir)
        if self.state is not None and self.state.loaded_stopped and self.resumed_at[1] == 0:
            # Training had stopped early before the kill: no epoch is left (fit starts at
            # the epoch after the restored one).
            logging.info("training had stopped early after epoch %d: nothing left to train",
                         self.resumed_at[0])
            state._ckpt_saved_epoch.assign(self.params["epochs"] - 1)
            state._ckpt_saved_batch.assign((steps or 0) - 1)

    def _restore_trackables(self) -> None:
        """Adds `trackables` to the backup checkpoint and restores them from the current backup."""
        if not self.trackables:
            return
        manager = self._training_state.read_checkpoint_manager
        for name, trackable in self.trackables.items():
            setattr(manager.checkpoint, name, trackable)
        if manager.latest_checkpoint:
            checkpoint = tf.train.Checkpoint(**self.trackables)
            status = checkpoint.restore(manager.latest_checkpoint).expect_partial()
            try:
                status.assert_existing_objects_matched()
            except AssertionError:
                logging.warning("the backup in %s holds no (or other) %s: they start afresh",
                                self.backup_dir, ", ".join(self.trackables))

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
        """Writes the backup of the current state (epoch and last finished step), with the
        callbacks' state, unless one of `checks` refuses it."""
        for check in self.checks:
            if check() is False:
                return
        if self.state is not None:
            self.state.save(self.model)
        self._training_state.back_up(epoch=self._current_epoch)
        self._steps_since_backup = 0


def resume_point(epoch: int, batch: int, steps_per_epoch: int) -> tuple[int, int]:
    """(epoch, step) where training continues after a backup taken after step `batch` of
    `epoch` (0-based): the next step, or the next epoch's first after an epoch's last step."""
    if 0 <= batch != steps_per_epoch - 1:
        return epoch, batch + 1
    return epoch + 1, 0


def backed_up(backup_dir: str) -> bool:
    """Whether `backup_dir` holds a backup to resume from."""
    return tf.train.latest_checkpoint(posixpath.join(backup_dir, "chief")) is not None


def steps_done(backup_dir: str, steps_per_epoch: int) -> int:
    """How many steps the backup in `backup_dir` has finished (0 without one): where the data
    of a resumed run starts. Read from the checkpoint before `fit` restores it, with the same
    rule (`resume_point`) as `Backup.on_train_begin`."""
    latest = tf.train.latest_checkpoint(posixpath.join(backup_dir, "chief"))
    if not latest:
        return 0
    values = tf.train.load_checkpoint(latest)
    epoch, batch = (int(values.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE"))
                    for name in ("ckpt_saved_epoch", "ckpt_saved_batch"))
    if epoch < 0:
        return 0
    epoch, step = resume_point(epoch, batch, steps_per_epoch)
    return epoch * steps_per_epoch + step

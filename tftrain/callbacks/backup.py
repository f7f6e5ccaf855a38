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

`write_async` (`train.async_backup`): each backup is written by TensorFlow's async checkpointing
(`tf.train.CheckpointOptions(enable_async=True)`): the step waits while the variables are copied
into host memory, and for the previous write if it is still going (at most one in flight); the
files are written on a background thread, and the checkpoint manager makes a backup the one to
resume from only once its files are whole, so a kill during a write leaves the previous backup
current. The writer walks the model's object graph while training goes on, so that graph must
not change during a write: the model's test and predict functions are made before the first
backup, and `wait()` blocks until the write in flight is whole at each epoch's end (before
the next epoch's callbacks may recompile the model), at the end of training, before a rollback
and after a SIGTERM's backup. The step backups are the ones written while training goes on. `stats` (summary.json["backup"]) counts the backups, the
seconds the steps were blocked, the seconds of writing and the bytes written.
"""
from __future__ import annotations

import dataclasses
import posixpath
import threading
import time

import tensorflow as tf
import tf_keras as keras
from absl import logging


@dataclasses.dataclass
class BackupStats:
    """What the backups of a run cost (summary.json["backup"])."""

    write_async: bool = False
    count: int = 0  # backups taken (by this attempt of the run)
    blocked_seconds: float = 0.0  # the steps waited this long for them
    write_seconds: float = 0.0  # from each backup's start until its files were whole
    bytes: int = 0  # the checkpoint files written
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def written(self, seconds: float, prefix: str) -> None:
        """Records a whole backup at checkpoint `prefix` that took `seconds` to write."""
        size = sum(tf.io.gfile.stat(path).length for path in tf.io.gfile.glob(prefix + ".*"))
        with self._lock:
            self.write_seconds += seconds
            self.bytes += size

    def summary(self) -> dict:
        """The JSON form."""
        with self._lock:
            return {"async": self.write_async, "count": self.count,
                    "blocked_seconds": round(self.blocked_seconds, 3),
                    "write_seconds": round(self.write_seconds, 3), "bytes": self.bytes}


class Backup(keras.callbacks.BackupAndRestore):
    """`BackupAndRestore(backup_dir)` that backs up every `every_steps` steps (0: epochs only),
    in the background when `write_async`."""

    def __init__(self, backup_dir: str, every_steps: int = 0, write_async: bool = False,
                 writes: bool = True):
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
        self.write_async = write_async
        # False: this worker restores the chief's backup but never writes one (a multi-worker
        # pipeline's other workers, whose saves would only repeat the chief's into its files)
        self.writes = writes
        self.stats = BackupStats(write_async)
        self._writer = None  # the background writer's CheckpointManager (`_background_writer`)
        self._next_number = 1

    def on_train_begin(self, logs=None):
        if self.write_async:
            # The model's test and predict functions, made now: made by the first validation
            # while a write in the background walks the model's object graph, the new node
            # breaks that write (a KeyError from TensorFlow's writer thread, seen at 300M).
            self.model.make_test_function()
            self.model.make_predict_function()
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
        self.wait()  # whole before the next epoch's callbacks may change the model


    def back_up_now(self) -> None:
        """Writes the backup of the current state (epoch and last finished step), with the
        callbacks' state, unless one of `checks` refuses it."""
        if not self.writes:
            self._steps_since_backup = 0
            return
        for check in self.checks:
            if check() is False:
                return
        if self.state is not None:
            self.state.save(self.model)
        started = time.monotonic()
        if self.write_async:
            self._background_writer().save(
                checkpoint_number=self._next_number, options=tf.train.CheckpointOptions(
                    enable_async=True, experimental_write_callbacks=[
                        lambda prefix: self.stats.written(time.monotonic() - started, prefix)]))
            self._next_number += 1
        else:
            self._training_state.back_up(epoch=self._current_epoch)
            manager = self._training_state.write_checkpoint_manager
            if manager.latest_checkpoint:  # a non-chief worker's temporary copy is gone
                self.stats.written(time.monotonic() - started, manager.latest_checkpoint)
        self.stats.count += 1
        self.stats.blocked_seconds += time.monotonic() - started
        self._steps_since_backup = 0

    def _background_writer(self) -> tf.train.CheckpointManager:
        """The manager of the backups written in the background (made on the first).

        TensorFlow's async writer saves what its checkpoint was constructed with, not what was
        attached to it later (as `trackables` are to Keras's), so it gets a checkpoint of its
        own holding the same objects under the same names. Its save counter is its own too
        (an async save writes 0 for it): the number of each backup is given, one more than
        the current one's, so a backup never overwrites the one a resumed run read."""
        if self._writer is None:
            state = self._training_state
            checkpoint = tf.train.Checkpoint(
                model=self.model, ckpt_saved_epoch=state._ckpt_saved_epoch,
                ckpt_saved_batch=state._ckpt_saved_batch, train_counter=self.model._train_counter,
                **self.trackables)
            reader = state.read_checkpoint_manager
            self._writer = tf.train.CheckpointManager(
                checkpoint, reader.directory, max_to_keep=reader._max_to_keep)
            latest = reader.latest_checkpoint
            self._next_number = int(latest.rsplit("-", 1)[1]) + 1 if latest else 1
        return self._writer

    def wait(self) -> None:
        """Blocks until the backup being written in the background (if any) is whole."""
        if self._writer is not None:
            started = time.monotonic()
            self._writer.sync()
            self.stats.blocked_seconds += time.monotonic() - started

    def on_train_end(self, logs=None):
        self.wait()
        super().on_train_end(logs)


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

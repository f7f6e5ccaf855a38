"""The divergence guard: a NaN or Inf loss stops the run, or rolls it back (`train.on_nan`).

What is checked: the training loss and the gradients' global norm (`grad_norm`, from
`callbacks.gradient_norm`) in the logs after every step (with `steps_per_execution`
N > 1, after every N steps: that is all `fit` shows), the training and validation losses at
each epoch end, and the weights before each backup is written (an update can turn the weights
to NaN while the loss of that step is still finite): a backup, hence a resumed run, never
starts from NaN weights. The guard runs first in the callback list, so nothing after it (best
checkpoint, early stopping, backup) sees a diverged step first.

stop: raises `Diverged`, one line naming the step and the last finite loss; the CLI exits 1.
rollback: restores the weights and optimizer state (step count included) of the last backup
(`Backup.back_up_at_start` makes one before the first step), multiplies the learning rate by
`train.rollback_lr_factor` (the optimizer's rate variable, or the scale of the schedule, see
`optimizers.learning_rate_variable`) and goes on with the next step; the data iterator goes
on too. After `train.max_rollbacks` rollbacks the next divergence stops as `stop` does. The
rollback count and the scale are saved in the backup (`get_state`), so a resumed run keeps them.

Multi-worker: the loss in the logs is all-reduced across workers by `fit` (a SUM over
replicas), so every worker sees the same value and decides the same at the same step; all of
them restore the chief's backup.
"""
from __future__ import annotations

import math
import posixpath

import tensorflow as tf
import tf_keras as keras
from absl import logging

from tftrain.training import optimizers
from tftrain.errors import ConfigError, TftrainError
from tftrain.fileio import join


class Diverged(TftrainError):
    """The loss (or the weights) became NaN or Inf; the message names where."""


class DivergenceGuard(keras.callbacks.Callback):
    """Stops or rolls back a run whose loss is not finite.

    Args:
        mode: "stop" or "rollback" (`train.on_nan`).
        backup: the run's `Backup` callback: its last backup is the rollback point, and its
            `checks` get the guard's weight check.
        lr_factor: the learning rate is multiplied by it at each rollback.
        max_rollbacks: rollbacks allowed before a divergence stops the run.
    """

    def __init__(self, mode: str, backup, lr_factor: float = 0.5, max_rollbacks: int = 3):
        super().__init__()
        self._supports_tf_logs = True
        self.mode = mode
        self.backup = backup
        self.lr_factor = lr_factor
        self.max_rollbacks = max_rollbacks
        self.rollbacks = 0
        self.last_finite = None  # (global step, loss)
        self._epoch = 0
        backup.checks.append(self.check_weights)
        backup.back_up_at_start = backup.back_up_at_start or mode == "rollback"

    def on_train_begin(self, logs=None):
        rate = optimizers.learning_rate_variable(self.model.optimizer)
        if self.mode == "rollback" and rate is None:
            raise ConfigError("train.on_nan=rollback cannot lower this learning-rate schedule "
                              "(it is not an optimizers.Scaled one): use train.on_nan=stop")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        step = self._epoch * (self.params.get("steps") or 0) + batch + 1
        loss = float((logs or {}).get("loss", 0.0))  # waits for the step: the value is needed
        norm = float((logs or {}).get("grad_norm", 0.0))  # `callbacks.gradient_norm`, if run
        where = f"epoch {self._epoch + 1} step {batch + 1} (global step {step})"
        if not math.isfinite(loss):
            self._diverged(f"the training loss is {loss}", where)
        elif not math.isfinite(norm):
            self._diverged(f"the gradients' global norm is {norm}", where)
        else:
            self.last_finite = (step, loss)

    def on_epoch_end(self, epoch, logs=None):
        for key in ("loss", "val_loss"):
            value = (logs or {}).get(key)
            if value is not None and not math.isfinite(float(value)):
                self._diverged(f"the {'validation' if key == 'val_loss' else 'training'} loss "
                               f"is {float(value)}", f"the end of epoch {epoch + 1}")
                return

    def check_weights(self) -> bool:
        """Before a backup: True if every weight is finite; else stops or rolls back (False)."""
        if all(bool(tf.reduce_all(tf.math.is_finite(v))) for v in self.model.trainable_variables):
            return True
        self._diverged("the weights hold NaN or Inf", f"the backup of epoch {self._epoch + 1}")
        return False

    def _diverged(self, cause: str, where: str) -> None:
        last = (f"the last finite loss was {self.last_finite[1]:.6g} at global step "
                f"{self.last_finite[0]}" if self.last_finite else "no finite loss was seen")
        if self.mode == "rollback" and self.rollbacks < self.max_rollbacks:
            self._roll_back(cause, where, last)
            return
        done = (f" after {self.rollbacks} rollback(s) (train.max_rollbacks={self.max_rollbacks})"
                if self.mode == "rollback" else "")
        kept = (f"the last good backup is kept in {self.backup.backup_dir}"
                if tf.train.latest_checkpoint(join(self.backup.backup_dir, "chief"))
                else "no backup was written")
        advice = ("set train.on_nan=rollback to restore the last backup with a lower rate and go on"
                  if self.mode == "stop" else "lower train.rollback_lr_factor")
        raise Diverged(f"training diverged{done}: {cause} at {where}; {last}; {kept}. Lower "
                       "train.learning_rate (or clip the gradients: train.clip_global_norm=1.0), "
                       f"or {advice}.")

    def _roll_back(self, cause: str, where: str, last: str) -> None:
        self.backup.wait()  # a backup still being written becomes the rollback point
        path = tf.train.latest_checkpoint(join(self.backup.backup_dir, "chief"))
        if path is None:  # cannot happen after back_up_at_start; stop rather than guess
            raise Diverged(f"training diverged: {cause} at {where}; {last}; no backup in "
                           f"{self.backup.backup_dir} to roll back to.")
        rate = optimizers.learning_rate_variable(self.model.optimizer)
        lowered = float(rate.numpy()) * self.lr_factor
        tf.train.Checkpoint(model=self.model).restore(path).expect_partial()
        rate.assign(lowered)  # the restored backup may hold a higher rate or scale
        self.model.reset_metrics()  # the epoch's running loss holds the NaN
        self.rollbacks += 1
        self.last_finite = None
        optimizer = self.model.optimizer
        schedule = optimizers.schedule_of(optimizer)
        if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            schedule = schedule(optimizer.iterations)
        # A constant rate is the variable itself, a MirroredVariable under tf.distribute.
        rate_now = float(keras.backend.get_value(schedule))
        logging.warning(
            "divergence guard: %s at %s (%s); rolled back to %s (optimizer step %d), learning "
            "rate x%g -> %.6g (rollback %d of %d)", cause, where, last, posixpath.basename(path),
            int(optimizer.iterations.numpy()), self.lr_factor, rate_now, self.rollbacks,
            self.max_rollbacks)

    def get_state(self) -> dict:
        """The rollback count and the learning-rate scale of a schedule (see module doc)."""
        scale = self._schedule_scale()
        return {"rollbacks": self.rollbacks,
                "lr_scale": float(scale.numpy()) if scale is not None else 1.0}

    def set_state(self, state: dict) -> None:
        """Takes the state of a backup."""
        self.rollbacks = int(state["rollbacks"])
        scale = self._schedule_scale()
        if scale is not None:
            scale.assign(state["lr_scale"])

    def _schedule_scale(self):
        """The scale of an `optimizers.Scaled` schedule (a plain rate is the optimizer's own
        variable, in the backup already), or None."""
        if self.model is None:  # asked for its field names before fit
            return None
        schedule = optimizers.schedule_of(self.model.optimizer)
        return schedule.scale if isinstance(schedule, optimizers.Scaled) else None


def rollbacks_of(callbacks) -> int:
    """The rollbacks the run's guard made (0 without a guard)."""
    return next((c.rollbacks for c in callbacks if isinstance(c, DivergenceGuard)), 0)

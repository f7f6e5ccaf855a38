"""The counters of the run's callbacks, saved in the backup checkpoint itself.

Keras callbacks keep their state in Python attributes, which `BackupAndRestore` does not save:
without this, a resumed run restarts early stopping's patience, reduce-on-plateau's counters,
the best checkpoint's value (so a worse epoch overwrites `checkpoints/best`) and the timer.

How: `CallbackState` holds one tf.Variable per field of each stateful callback and is added to
the same `tf.train.Checkpoint` the backup writes (see `Backup.on_train_begin`). The fields are
copied into the variables right before each backup is written (`save`, not at every step), and
back into the callbacks once after the backup is restored (`load`). One checkpoint holds the
weights and the counters, and `tf.train.CheckpointManager` makes a checkpoint current only once
all of it is written: a kill at any moment leaves the previous pair or the new pair, never new
weights with old counters. Multi-worker runs need nothing more: every worker saves the same
checkpoint (the non-chief ones into temporary directories) and restores the chief's.

Protocol: a callback with `get_state() -> dict[str, float]` and `set_state(dict)` (StepTimer,
DivergenceGuard) is stateful; for the stock Keras callbacks `STOCK_FIELDS` names the attributes.
The learning rate set by ReduceLROnPlateau is the optimizer's variable, restored with it.
`EarlyStopping.best_weights` is not kept: tftrain does not turn on `restore_best_weights`.
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras as keras
from absl import logging

STOCK_FIELDS = {
    keras.callbacks.EarlyStopping: ("wait", "best", "stopped_epoch", "best_epoch"),
    keras.callbacks.ReduceLROnPlateau: ("wait", "cooldown_counter", "best"),
    keras.callbacks.ModelCheckpoint: ("best",),
}
INTEGER_FIELDS = ("wait", "stopped_epoch", "best_epoch", "cooldown_counter")


def fields_of(callback) -> tuple[str, ...] | None:
    """The names of `callback`'s state, or None for a stateless callback."""
    if callable(getattr(callback, "get_state", None)):
        return tuple(callback.get_state())
    return next((names for cls, names in STOCK_FIELDS.items() if isinstance(callback, cls)), None)


def _get(callback) -> dict:
    if callable(getattr(callback, "get_state", None)):
        return callback.get_state()
    return {name: getattr(callback, name) for name in fields_of(callback)}


def _set(callback, state: dict) -> None:
    if callable(getattr(callback, "set_state", None)):
        callback.set_state(state)
        return
    for name, value in state.items():
        setattr(callback, name, int(value) if name in INTEGER_FIELDS else value)


class CallbackState:
    """The state of the stateful callbacks among `callbacks`, as checkpointable variables.

    `trackable` is what the backup checkpoint holds. Build it outside the strategy's scope
    (plain variables, the same on every worker). `stopped` records whether training had been
    stopped (early stopping) when the backup was written, so that a run killed after stopping
    early does not train another epoch.
    """

    def __init__(self, callbacks):
        self._callbacks = {}
        self.values = {}
        for callback in callbacks:
            names = fields_of(callback)
            if names is None:
                continue
            key = type(callback).__name__
            key = key if key not in self._callbacks else f"{key}_{len(self._callbacks)}"
            self._callbacks[key] = callback
            self.values[key] = {name: tf.Variable(0.0, dtype=tf.float64, trainable=False)
                                for name in names}
        self.saved = tf.Variable(False, trainable=False)  # False in a backup written without it
        self.stopped = tf.Variable(False, trainable=False)
        self.loaded_stopped = False  # what `load` found
        self.trackable = tf.train.Checkpoint(
            saved=self.saved, stopped=self.stopped,
            **{key: tf.train.Checkpoint(**fields) for key, fields in self.values.items()})

    def save(self, model) -> None:
        """Copies the callbacks' state into the variables (call it right before a backup)."""
        for key, callback in self._callbacks.items():
            for name, value in _get(callback).items():
                self.values[key][name].assign(float(value))
        self.stopped.assign(bool(model.stop_training))
        self.saved.assign(True)

    def load(self) -> bool:
        """Copies restored variables back into the callbacks; False if the backup had none."""
        if not bool(self.saved.numpy()):
            return False
        for key, callback in self._callbacks.items():
            _set(callback, {name: float(v.numpy()) for name, v in self.values[key].items()})
        self.loaded_stopped = bool(self.stopped.numpy())
        logging.info("restored the state of %s", ", ".join(self._callbacks) or "no callback")
        return True

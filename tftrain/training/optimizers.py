"""Optimizers and learning-rate schedules: `train.optimizer` and `train.lr_schedule`.

Schedules are functions of the optimizer's step count (`optimizer.iterations`), which the
backup restores, so a resumed run continues on the same curve. `plateau` is not a schedule:
the rate is a plain variable that the `ReduceLROnPlateau` callback lowers (see `plateau_callback`);
that variable belongs to the optimizer, so the backup restores a lowered rate too.

The divergence guard (`train.on_nan=rollback`) lowers the rate through `learning_rate_variable`:
the optimizer's own rate variable for a plain rate, else the `scale` of a `Scaled` schedule
(`make_schedule` wraps schedules in one for that mode), which the guard keeps in the backup.
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from tftrain import config_schema as config_lib


class LinearWarmup(keras.optimizers.schedules.LearningRateSchedule):
    """Rises linearly from 0 to `after(0)` over `warmup_steps`, then follows `after`."""

    def __init__(self, after, warmup_steps: int):
        super().__init__()
        self.after = after
        self.warmup_steps = warmup_steps

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = float(self.warmup_steps)
        after = self.after(tf.maximum(step - warmup, 0.0))
        return tf.where(step < warmup, self.after(0.0) * (step + 1.0) / warmup, after)

    def get_config(self):
        return {"after": keras.optimizers.schedules.serialize(self.after),
                "warmup_steps": self.warmup_steps}


class Constant(keras.optimizers.schedules.LearningRateSchedule):
    """A constant rate, as a schedule (so that warmup can be put in front of it)."""

    def __init__(self, rate: float):
        super().__init__()
        self.rate = rate

    def __call__(self, step):
        return tf.constant(self.rate, tf.float32)

    def get_config(self):
        return {"rate": self.rate}


class Scaled(keras.optimizers.schedules.LearningRateSchedule):
    """`schedule` times a variable `scale` (1 at first) that the divergence guard lowers.

    Create it inside the strategy's scope (as `compile` does), so `scale` is distributed like
    the optimizer's variables.
    """

    def __init__(self, schedule, scale: float = 1.0):
        super().__init__()
        self.schedule = schedule
        self.scale = tf.Variable(scale, dtype=tf.float32, trainable=False, name="lr_scale")

    def __call__(self, step):
        return self.schedule(step) * self.scale

    def get_config(self):
        return {"schedule": keras.optimizers.schedules.serialize(self.schedule),
                "scale": float(self.scale.numpy())}


def make_schedule(train: config_lib.TrainConfig, steps_per_epoch: int, total_steps: int):
    """The learning rate: a float (constant, plateau) or a schedule over optimizer steps.

    step: StepLR — multiply by `lr_decay_rate` every `lr_decay_epochs` epochs.
    cosine: from `learning_rate` down to `lr_min` over the steps after warmup.
    Each but plateau is preceded by `warmup_steps` of linear warmup when that is > 0.
    With `on_nan=rollback` a schedule is `Scaled`, so that a rollback can lower it.
    """
    schedule = _unscaled_schedule(train, steps_per_epoch, total_steps)
    if train.on_nan == "rollback" and not isinstance(schedule, float):
        return Scaled(schedule)
    return schedule


def _unscaled_schedule(train: config_lib.TrainConfig, steps_per_epoch: int, total_steps: int):
    lr = train.learning_rate
    if train.lr_schedule == "plateau" or (train.lr_schedule == "constant" and not train.warmup_steps):
        return lr
    if train.lr_schedule == "constant":
        schedule = Constant(lr)
    elif train.lr_schedule == "step":
        schedule = keras.optimizers.schedules.ExponentialDecay(
            lr, decay_steps=train.lr_decay_epochs * steps_per_epoch,
            decay_rate=train.lr_decay_rate, staircase=True)
    else:  # cosine
        decay_steps = max(1, total_steps - train.warmup_steps)
        schedule = keras.optimizers.schedules.CosineDecay(
            lr, decay_steps=decay_steps, alpha=train.lr_min / lr)
    return LinearWarmup(schedule, train.warmup_steps) if train.warmup_steps else schedule


def make_optimizer(train: config_lib.TrainConfig, steps_per_epoch: int, total_steps: int):
    """The optimizer that `train.optimizer` names, with its learning-rate schedule.

    Under `mixed_float16`, `Model.compile` wraps it in a `LossScaleOptimizer` (dynamic loss
    scaling); nothing is needed here.
    """
    lr = make_schedule(train, steps_per_epoch, total_steps)
    if train.optimizer == "sgd":
        return keras.optimizers.SGD(lr, momentum=train.momentum)
    if train.optimizer == "adamw":
        return keras.optimizers.AdamW(lr, weight_decay=train.weight_decay)
    return keras.optimizers.Adam(lr)


def current_learning_rate(optimizer) -> float:
    """The rate the optimizer applies at its current step (schedules evaluated)."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer
    lr = optimizer.learning_rate
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
        lr = lr(optimizer.iterations)
    return float(keras.backend.get_value(lr))


def schedule_of(optimizer):
    """The rate the optimizer was given: its rate variable, or the schedule itself (for a
    schedule, `optimizer.learning_rate` of tf-keras is the rate of the last step)."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer
    return getattr(optimizer, "_learning_rate", optimizer.learning_rate)


def learning_rate_variable(optimizer) -> tf.Variable | None:
    """The variable a rollback multiplies to lower the rate: the optimizer's rate variable for
    a plain rate, the `scale` of a `Scaled` schedule; None for an unscaled schedule."""
    lr = schedule_of(optimizer)
    if isinstance(lr, Scaled):
        return lr.scale
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
        return None
    return lr


def plateau_callback(train: config_lib.TrainConfig, mode: str = "auto"):
    """`ReduceLROnPlateau` for `lr_schedule=plateau`, else None. `mode` is the task's direction
    for `train.monitor` (the callback's own `auto` knows only "acc" names as higher-is-better)."""
    if train.lr_schedule != "plateau":
        return None
    return keras.callbacks.ReduceLROnPlateau(
        monitor=train.monitor, factor=train.lr_decay_rate, patience=train.plateau_patience,
        min_lr=train.lr_min, mode=mode, verbose=1)


def optimizer_slots(name: str) -> int:
    """Variables per trainable weight that `train.optimizer` keeps: adam and adamw 2 (moments),
    sgd 1 (tf-keras SGD builds its momentum slot even at momentum 0, measured on 2.21)."""
    return {"sgd": 1}.get(name, 2)

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
from tftrain.training import ema
from tftrain.training.gradients import GradientNorm


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


def make_schedule(train: config_lib.TrainConfig, steps_per_epoch: int, total_steps: int,
                  examples_per_step: int = 0):
    """The learning rate: a float (constant, plateau) or a schedule over optimizer steps.

    The peak rate is `peak_learning_rate` (scaled to `examples_per_step`, the examples of one
    update, when `train.lr_base_batch_size` is set).
    step: StepLR — multiply by `lr_decay_rate` every `lr_decay_epochs` epochs.
    cosine: from the peak rate down to `lr_min` over the steps after warmup.
    Each but plateau is preceded by `warmup_steps(train, steps_per_epoch)` of linear warmup
    when that is > 0. With `on_nan=rollback` a schedule is `Scaled`, so that a rollback can
    lower it.
    """
    schedule = _unscaled_schedule(train, steps_per_epoch, total_steps,
                                  peak_learning_rate(train, examples_per_step))
    if train.on_nan == "rollback" and not isinstance(schedule, float):
        return Scaled(schedule)
    return schedule


def peak_learning_rate(train: config_lib.TrainConfig, examples_per_step: int) -> float:
    """`train.learning_rate`, scaled linearly from a global batch of `train.lr_base_batch_size`
    examples to `examples_per_step` when both are known (Goyal et al., 2017)."""
    if not (train.lr_base_batch_size and examples_per_step):
        return train.learning_rate
    return train.learning_rate * examples_per_step / train.lr_base_batch_size


def warmup_steps(train: config_lib.TrainConfig, steps_per_epoch: int) -> int:
    """The steps of linear warmup: `train.warmup_steps`, or `train.warmup_epochs` of
    `steps_per_epoch` steps (at least 1 when warmup is asked for)."""
    if train.warmup_epochs:
        return max(1, round(train.warmup_epochs * steps_per_epoch))
    return train.warmup_steps


def _unscaled_schedule(train: config_lib.TrainConfig, steps_per_epoch: int, total_steps: int,
                       lr: float):
    warmup = warmup_steps(train, steps_per_epoch)
    if train.lr_schedule == "plateau" or (train.lr_schedule == "constant" and not warmup):
        return lr
    if train.lr_schedule == "constant":
        schedule = Constant(lr)
    elif train.lr_schedule == "step":
        schedule = keras.optimizers.schedules.ExponentialDecay(
            lr, decay_steps=train.lr_decay_epochs * steps_per_epoch,
            decay_rate=train.lr_decay_rate, staircase=True)
    else:  # cosine
        decay_steps = max(1, total_steps - warmup)
        schedule = keras.optimizers.schedules.CosineDecay(
            lr, decay_steps=decay_steps, alpha=train.lr_min / lr)
    return LinearWarmup(schedule, warmup) if warmup else schedule


class KernelL2:
    """Adds `l2 * weight` to the gradient of each weight of rank >= 2 (kernels and embeddings;
    not biases or normalization scales) before the optimizer's update: L2 regularization as
    Model Garden's `l2_weight_decay` and PyTorch's SGD `weight_decay` apply it (through the
    momentum), after the gradients' norm was measured and clipped."""

    def __init__(self, *args, l2: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.l2 = l2

    def update_step(self, gradient, variable):
        if self.l2 and variable.shape.rank >= 2:
            gradient = tf.convert_to_tensor(gradient) + tf.cast(self.l2, variable.dtype) * variable
        return super().update_step(gradient, variable)

    def get_config(self):
        return {**super().get_config(), "l2": self.l2}


class SGD(KernelL2, GradientNorm, keras.optimizers.SGD):
    """tf-keras SGD, its gradients' global norm measured and clipped (`gradients`), with L2 on
    its kernels (`KernelL2`)."""


class Adam(GradientNorm, keras.optimizers.Adam):
    """tf-keras Adam, its gradients' global norm measured and clipped (`gradients`)."""


class AdamW(GradientNorm, keras.optimizers.AdamW):
    """tf-keras AdamW, its gradients' global norm measured and clipped (`gradients`)."""


class FactoredAdafactor(keras.optimizers.Adafactor):
    """tf-keras's Adafactor (Shazeer and Stern, 2018) keeping only what the method needs.

    tf-keras 2.21's keeps, besides a weight's factored second moment (the row means `r` and
    column means `c` of the squared gradients, over the last two dimensions), a full-size `v`
    for every weight, and dummy `r`, `c` for vectors: as much state as Adam's second moment.
    This one keeps `r` and `c` for weights of rank >= 2 and a full `v` only for the others,
    and computes the full-size estimate per step as a temporary. The arithmetic and the
    hyperparameters are tf-keras's (no first moment; with a constant rate and `relative_step`
    the step is min(rate, 1/sqrt(t))). Each variable is written once per step from values read
    before the write, so the same update runs under DTensor (`runtime.dtensor_optimizers`).
    """

    def build(self, var_list):
        """Creates `r` and `c` for each weight of rank >= 2, `v` for the others."""
        keras.optimizers.Optimizer.build(self, var_list)  # the step count and the index
        if getattr(self, "_built", False):
            return
        self._built = True
        self._r, self._c, self._v = [], [], []
        for var in var_list:
            shape = tuple(var.shape)
            if len(shape) >= 2:
                self._r.append(self._zeros_like_part(var, "r", shape[:-1]))
                self._c.append(self._zeros_like_part(var, "c", shape[:-2] + shape[-1:]))
                self._v.append(None)
            else:
                self._r.append(None)
                self._c.append(None)
                self._v.append(self.add_variable_from_reference(var, "v"))

    def _zeros_like_part(self, var, name: str, shape: tuple):
        """A zero slot of `shape` for `var` (placed with it under a strategy or a mesh)."""
        return self.add_variable_from_reference(
            var, name, shape=shape, initial_value=tf.zeros(shape, dtype=var.dtype))

    def _rate_and_step(self, variable):
        """This step's learning rate and 1-based step count (DTensor reads them once per step)."""
        return (tf.cast(self.learning_rate, variable.dtype),
                tf.cast(self.iterations + 1, variable.dtype))

    def _to_slot(self, tensor, slot):
        """Layout hooks for DTensor's sharded optimizer state; nothing to do here."""
        return tensor

    def _to_weight(self, tensor, variable):
        return tensor

    def _gathered(self, tensor):
        return tensor

    def _apply_delta(self, variable, delta):
        """`variable -= delta` (DTensor writes the weight's average from the same value)."""
        variable.assign_sub(delta)

    def update_step(self, gradient, variable):
        """One write to `r` and `c` (or `v`) and one to the variable."""
        lr, step = self._rate_and_step(variable)
        if self.relative_step and not isinstance(self._learning_rate,
                                                 keras.optimizers.schedules.LearningRateSchedule):
            lr = tf.minimum(lr, tf.math.rsqrt(step))
        index = self._index_dict[self._var_key(variable)]
        gradient = tf.convert_to_tensor(gradient)
        alpha = tf.maximum(tf.cast(self.epsilon_2, variable.dtype),
                           _rms(variable)) * tf.minimum(lr, tf.math.rsqrt(step))
        squared = tf.square(gradient) + self.epsilon_1
        beta_2 = 1 - tf.pow(step, self.beta_2_decay)
        if self._v[index] is None:
            r, c = self._r[index], self._c[index]
            new_r = beta_2 * r + (1 - beta_2) * self._to_slot(tf.reduce_mean(squared, -1), r)
            new_c = beta_2 * c + (1 - beta_2) * self._to_slot(tf.reduce_mean(squared, -2), c)
            r.assign(new_r)
            c.assign(new_c)
            new_r, new_c = self._gathered(new_r), self._gathered(new_c)
            # rsqrt(v) as rsqrt(row factor) * rsqrt(column factor): their product v underflows
            # to 0 for a row of zero gradients (an always-blank pixel's weights), and 0 * inf
            # made tf-keras's update NaN there.
            row = tf.math.rsqrt(new_r / tf.reduce_mean(new_r, axis=-1, keepdims=True))
            update = gradient * tf.expand_dims(row, -1) * tf.expand_dims(tf.math.rsqrt(new_c), -2)
        else:
            new_v = (beta_2 * self._v[index]
                     + (1 - beta_2) * self._to_slot(squared, self._v[index]))
            self._v[index].assign(new_v)
            update = gradient * tf.math.rsqrt(self._to_weight(new_v, variable))
        update = update / tf.maximum(1.0, _rms(update) / self.clip_threshold)
        self._apply_delta(variable, alpha * update)


class Adafactor(GradientNorm, FactoredAdafactor):
    """`FactoredAdafactor`, its gradients' global norm measured and clipped (`gradients`)."""


def _rms(x):
    return tf.sqrt(tf.reduce_mean(tf.square(x)))


def make_optimizer(train: config_lib.TrainConfig, steps_per_epoch: int, total_steps: int,
                   examples_per_step: int = 0):
    """The optimizer that `train.optimizer` names, with its learning-rate schedule.

    With `train.ema_decay` > 0 it keeps a moving average of the weights (`training.ema`).
    Under `mixed_float16`, `Model.compile` wraps it in a `LossScaleOptimizer` (dynamic loss
    scaling); nothing is needed here. Every update's gradients have their global norm measured
    and, with `train.clip_global_norm` > 0, clipped to it (`training.gradients`).
    """
    lr = make_schedule(train, steps_per_epoch, total_steps, examples_per_step)
    clip = {"clip_global_norm": train.clip_global_norm}
    if train.optimizer == "sgd":
        return ema.make(SGD, train.ema_decay, lr, momentum=train.momentum, l2=train.weight_decay,
                        **clip)
    if train.optimizer == "adamw":
        return ema.make(AdamW, train.ema_decay, lr, weight_decay=train.weight_decay, **clip)
    if train.optimizer == "adafactor":
        return ema.make(Adafactor, train.ema_decay, lr, **clip)
    return ema.make(Adam, train.ema_decay, lr, **clip)


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
    sgd 1 (tf-keras SGD builds its momentum slot even at momentum 0, measured on 2.21),
    adafactor 1 (its second moment, factored for weights of rank >= 2: see `slot_shapes`)."""
    return {"sgd": 1, "adafactor": 1}.get(name, 2)


def slot_shapes(name: str, shape: tuple) -> list[tuple]:
    """The shapes of the optimizer variables `train.optimizer` keeps for one trainable weight
    of `shape`: adam and adamw two of `shape`, sgd one; adafactor, for a weight of rank >= 2,
    the row and column means of its second moment (`shape[:-1]` and `shape[:-2] + shape[-1:]`),
    else one of `shape`. What the plan (`tftrain check`) and the DTensor memory report count."""
    shape = tuple(int(d) for d in shape)
    if name == "adafactor":
        return [shape[:-1], shape[:-2] + shape[-1:]] if len(shape) >= 2 else [shape]
    return [shape] * optimizer_slots(name)

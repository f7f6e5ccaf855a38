"""An exponential moving average of the weights (`train.ema_decay`), kept by the optimizer.

tf-keras optimizers already keep one (`use_ema`): `build` adds an "average" slot per trained
weight, initialized to the weight, and each step, after the weights' updates, writes
`average = decay * average + (1 - decay) * weight` in cross-replica context (mirrored like its
weight under tf.distribute, beside it on a pipeline stage's device). `Averaging` reuses that
and changes two things:

- the decay is warmed up as Model Garden's is: `min(decay, (1 + t) / (10 + t))` at step t (1
  at the first step), so an average started from the random initial weights forgets them in a
  few dozen steps instead of thousands (t is the optimizer's step count, which the backup
  restores: a resumed run continues on the same curve);
- `finalize_variable_values` (which `fit` calls at its end to overwrite the weights with the
  average) does nothing: the trainer keeps the training weights, as the backup holds them, and
  the run says which weights each evaluation sees (`swap`, `callbacks.ema`).

The averages are optimizer variables, so every backup holds them, and an exactly resumed run
ends with the same average. DTensor's single-write optimizers (`runtime.dtensor_optimizers`)
write the average themselves, from the weight's new value; this module only gives them the
decay (`warmup_decay`).
"""
from __future__ import annotations

import functools

import tensorflow as tf


def warmup_decay(decay: float, step, dtype=tf.float32):
    """`min(decay, (1 + step) / (10 + step))`: the decay of step `step` (1-based)."""
    step = tf.cast(step, dtype)
    return tf.minimum(tf.cast(decay, dtype), (1.0 + step) / (10.0 + step))


class Averaging:
    """Mixin for a tf-keras optimizer class: `ema_decay` > 0 keeps the warmed-up average."""

    def __init__(self, *args, ema_decay: float = 0.0, **kwargs):
        super().__init__(*args, use_ema=ema_decay > 0, ema_momentum=ema_decay, **kwargs)
        self._record([])

    @tf.__internal__.tracking.no_automatic_dependency_tracking
    def _record(self, weights: list) -> None:
        # Not a checkpoint dependency: the weights are the model's to save, not the optimizer's.
        self.averaged = weights  # the weights that have an average, in the averages' order

    def build(self, var_list):
        """Records the weights whose averages the base `build` creates."""
        if not getattr(self, "_built", False):
            self._record(list(var_list))
        super().build(var_list)

    def _update_model_variables_moving_average(self, var_list):
        """tf-keras's update (one `extended.update` per average) with the warmed-up decay of
        this step (`iterations` counts the steps before it: the update runs before it grows)."""
        if not self.use_ema:
            return
        for var in var_list:
            average = self._model_variables_moving_average[self._index_dict[self._var_key(var)]]
            decay = warmup_decay(self.ema_momentum, self.iterations + 1, average.dtype)
            self._distribution_strategy.extended.update(
                average, _moved, args=(var, decay), group=False)

    def finalize_variable_values(self, var_list):
        """Nothing: after `fit` the model keeps its training weights (see the module docstring)."""


def _moved(average, weight, decay):
    return average.assign(decay * average + (1 - decay) * weight)


@functools.lru_cache(maxsize=None)
def _averaging_class(cls):
    return type(cls.__name__, (Averaging, cls), {"__module__": __name__})


def make(cls, ema_decay: float, *args, **kwargs):
    """`cls(*args, **kwargs)`, an optimizer that (`ema_decay` > 0) keeps the average of the
    weights it trains."""
    if not ema_decay:
        return cls(*args, **kwargs)
    return _averaging_class(cls)(*args, ema_decay=ema_decay, **kwargs)


def optimizer_of(trainer):
    """The optimizer of `trainer` that keeps the averages (inside a `LossScaleOptimizer`),
    or None when it keeps none."""
    optimizer = getattr(trainer.optimizer, "inner_optimizer", trainer.optimizer)
    return optimizer if getattr(optimizer, "use_ema", False) else None


def averages(optimizer) -> list:
    """The average variables of `optimizer` (an `Averaging` one), in the order of its weights."""
    return [optimizer._model_variables_moving_average[optimizer._index_dict[
        optimizer._var_key(weight)]] for weight in optimizer.averaged]


def swap(optimizer) -> None:
    """Exchanges the values of the averaged weights and of their averages (eagerly, on every
    copy of a mirrored variable, in place for a DTensor one); twice is the identity."""
    for weight, average in zip(optimizer.averaged, averages(optimizer)):
        held = tf.identity(weight)
        weight.assign(average)
        average.assign(held)

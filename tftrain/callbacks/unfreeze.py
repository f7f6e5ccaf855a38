"""Freeze-then-unfreeze fine-tuning: at one epoch, frozen layers start training at a lower rate.

A builder that wants it (`application` with `unfreeze_at_epoch`) records an
`UnfreezeSchedule` (`tftrain.models.fine_tuning`); the engine adds `requested_by(model)` to the
callbacks of `fit`.

What it takes to change what trains in the middle of `fit` (tf-keras 2.21):
- the optimizer builds its slots once, on the variables of its first step: it must know the
  layers that will train later before then (`on_train_begin` builds it on all of them);
- `train_step` reads `trainable_variables` when it is traced: the train function is traced
  again when the layers unfreeze;
- a later `fit` of the same compiled model starts from the `trainable` flags `compile` saw
  (`RespectCompiledTrainableState`): the layers unfreeze again at `at_epoch` (the rate is
  lowered once);
- the lower rate: a plain rate variable (or the `scale` of a `Scaled` schedule) is multiplied
  once; it lives in the optimizer's checkpoint, so a run resumed from a backup written after
  the unfreeze (optimizer step past the unfreeze step) is not lowered twice. Any other schedule
  (not checkpointed) is wrapped in a `Scaled` schedule in every process that unfreezes.
"""
from __future__ import annotations

import tf_keras as keras
from absl import logging

from tftrain.models import fine_tuning
from tftrain.training import optimizers


def requested_by(model: keras.Model) -> list:
    """The callbacks training `model` needs: an `Unfreeze` when its builder recorded a schedule
    (`tftrain.models.fine_tuning`); [] for most models."""
    unfreeze = fine_tuning.schedule_of(model)
    if unfreeze is None:
        return []
    return [Unfreeze(unfreeze.layers, unfreeze.at_epoch, unfreeze.lr_factor)]


def variables_to_train(trainer: keras.Model, model: keras.Model) -> list:
    """Every variable `trainer` will ever train: its trainable ones now, and those of the layers
    that `model`'s (the model inside `trainer`) schedule unfreezes later. An optimizer creates
    its slots once, for the variables it is built on."""
    schedule = fine_tuning.schedule_of(model)
    return _trainable_with(trainer, schedule.layers if schedule else [])


def _trainable_with(trainer: keras.Model, layers) -> list:
    """`trainer`'s trainable variables as if `layers` were trainable too (they are left as they
    were)."""
    flags = [layer.trainable for layer in layers]
    for layer in layers:
        layer.trainable = True
    try:
        return list(trainer.trainable_variables)
    finally:
        for layer, trainable in zip(layers, flags):
            layer.trainable = trainable


class Unfreeze(keras.callbacks.Callback):
    """Starts training `layers` at epoch `at_epoch`, with the rate multiplied by `lr_factor`.

    Args:
      layers: the layers to unfreeze, built frozen (`trainable=False`). Layers left out of it
        stay frozen: BatchNormalization layers left out keep running in inference mode.
      at_epoch: the first (0-based) epoch in which `layers` train.
      lr_factor: multiplies the learning rate from `at_epoch` on (e.g. 0.1).
    """

    def __init__(self, layers, at_epoch: int, lr_factor: float):
        super().__init__()
        self.layers = list(layers)
        self.at_epoch = at_epoch
        self.lr_factor = lr_factor
        self.lowered = False

    def _set_trainable(self, flags) -> None:
        for layer, trainable in zip(self.layers, flags):
            layer.trainable = trainable

    def on_train_begin(self, logs=None):
        optimizer = getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)
        if getattr(optimizer, "_built", False) or not hasattr(optimizer, "build"):
            return
        variables = _trainable_with(self.model, self.layers)  # all it will ever update
        with self.model.distribute_strategy.scope():
            optimizer.build(variables)

    def on_epoch_begin(self, epoch, logs=None):
        if epoch < self.at_epoch or all(layer.trainable for layer in self.layers):
            return
        self._set_trainable([True] * len(self.layers))
        self.model.make_train_function(force=True)  # trace train_step on the new variables
        lowered = False if self.lowered else self._lower_rate()
        self.lowered = True
        logging.info("epoch %d: %d frozen layers now train; learning rate %s", epoch + 1,
                     len(self.layers), f"x{self.lr_factor:g}" if lowered else "as it was")

    def _lower_rate(self) -> bool:
        """Multiplies the rate by `lr_factor`; False when the resumed backup had it already."""
        optimizer = getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)
        variable = optimizers.learning_rate_variable(optimizer)
        if variable is None:  # a schedule, not checkpointed: scale it in this process
            with self.model.distribute_strategy.scope():
                optimizer.learning_rate = optimizers.Scaled(optimizers.schedule_of(optimizer),
                                                            self.lr_factor)
            return True
        steps_per_epoch = (self.params or {}).get("steps")
        if steps_per_epoch and int(optimizer.iterations.numpy()) > self.at_epoch * steps_per_epoch:
            return False  # the backup was written after the unfreeze: its rate is lowered
        variable.assign(variable * self.lr_factor)
        return True

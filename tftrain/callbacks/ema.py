"""Validation and the best checkpoint see the weights' moving average (`train.ema_decay`).

The optimizer keeps the average (`training.ema`) and the model trains on its own weights;
`EvaluateAverage` swaps the average into the model around each validation (`on_test_begin`,
`on_test_end`) and, at each epoch's end, around the callbacks placed between it and its
`after` callback (the best checkpoint), then swaps the training weights back, so the backup,
written later at the epoch's end, holds the training weights and the average as they are.
"""
from __future__ import annotations

import tf_keras as keras

from tftrain.training import ema


class EvaluateAverage(keras.callbacks.Callback):
    """Swaps the optimizer's averages into the model for validation and for the callbacks
    between this one and `self.after` at each epoch end (put `after` right behind them)."""

    def __init__(self):
        super().__init__()
        self.after = _SwapBack(self)
        self._swapped = False

    def swap_in(self) -> None:
        """The model holds the averages (and the optimizer its training weights)."""
        if not self._swapped:
            ema.swap(ema.optimizer_of(self.model))
            self._swapped = True

    def swap_out(self) -> None:
        """The model holds its training weights again."""
        if self._swapped:
            ema.swap(ema.optimizer_of(self.model))
            self._swapped = False

    def on_test_begin(self, logs=None):
        self.swap_in()

    def on_test_end(self, logs=None):
        self.swap_out()

    def on_epoch_end(self, epoch, logs=None):
        self.swap_in()


class _SwapBack(keras.callbacks.Callback):
    """The end of an `EvaluateAverage`'s epoch-end span."""

    def __init__(self, owner: EvaluateAverage):
        super().__init__()
        self.owner = owner

    def on_epoch_end(self, epoch, logs=None):
        self.owner.swap_out()

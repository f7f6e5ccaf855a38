"""`train.steps`: ends training once the optimizer has made that many updates."""
from __future__ import annotations

import tf_keras as keras


class StopAtStep(keras.callbacks.Callback):
    """Stops `fit` when `epoch * steps_per_epoch + step` reaches `total_steps`.

    The last epoch is cut short; its validation still runs.
    """

    def __init__(self, total_steps: int):
        super().__init__()
        self._supports_tf_logs = True
        self.total_steps = total_steps
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self._epoch * self.params["steps"] + batch + 1 >= self.total_steps:
            self.model.stop_training = True

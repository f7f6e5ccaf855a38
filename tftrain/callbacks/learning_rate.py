"""The learning rate in the epoch logs: `learning_rate` in TensorBoard and in the history."""
from __future__ import annotations

import tf_keras as keras

from tftrain.training.optimizers import current_learning_rate


class LearningRateLogger(keras.callbacks.Callback):
    """Adds the rate in effect at the end of each epoch to the logs.

    Put it before the TensorBoard callback, which then writes it as `epoch_learning_rate`.
    """

    def __init__(self):
        super().__init__()
        self._supports_tf_logs = True

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = current_learning_rate(self.model.optimizer)

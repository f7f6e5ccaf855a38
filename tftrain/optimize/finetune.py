"""Fine-tunes a clone (pruning or quantization-aware training) with the training loss."""
from __future__ import annotations

import contextlib

import tf_keras as keras
from absl import logging


def training_loss(model: keras.Model, task=None):
    """The loss `model` was compiled with, else its task's (`tftrain.tasks`; default: sparse
    categorical cross-entropy, of logits unless the model ends in a softmax or sigmoid)."""
    loss = getattr(model, "loss", None)
    if loss:
        return loss
    from tftrain.tasks.classification import ClassificationTask

    return (task or ClassificationTask({})).loss(model)


def strategy_scope(strategy=None):
    """A fresh `strategy.scope()` (a scope object cannot be entered twice), or a null context."""
    return strategy.scope() if strategy is not None else contextlib.nullcontext()


def finetune(model: keras.Model, train_data, *, epochs: int, steps_per_epoch: int, loss,
             learning_rate: float = 1e-3, optimizer=None, callbacks=(), strategy=None,
             verbose: int = 0) -> keras.callbacks.History:
    """Compiles `model` with `loss` and an Adam optimizer (or `optimizer`) and fits it.

    `model` must have been built under `strategy.scope()` when a strategy is given; the
    optimizer is created under the same scope. `train_data` is anything `fit` accepts that
    yields at least `epochs * steps_per_epoch` batches (repeat it when in doubt).
    """
    with strategy_scope(strategy):
        model.compile(optimizer=optimizer or keras.optimizers.Adam(learning_rate), loss=loss)
    logging.info("fine-tuning %s: %d epochs x %d steps", model.name, epochs, steps_per_epoch)
    return model.fit(train_data, epochs=epochs, steps_per_epoch=steps_per_epoch,
                     callbacks=list(callbacks), verbose=verbose)

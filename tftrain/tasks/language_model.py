"""Language modeling: vocabulary logits at every position, next-token cross-entropy, perplexity.

The dataset is windows of token ids (`pipelines.text`): the inputs are a window's first
`sequence_length` tokens, the labels the same window shifted by one, so each position's label is
the token after it. The loss is the mean sparse categorical cross-entropy over every position
(from logits); `perplexity` is its exponential over the whole evaluation split (a streaming
Keras metric, `perplexity_metric`), and `accuracy` the fraction of positions whose most likely
next token is the right one (next-token accuracy). Prune and quantize gate on the relative
perplexity increase (`--max_metric_change`, 0.05: 5% higher).
"""
from __future__ import annotations

import math

import numpy as np

from tftrain.tasks.base import Task

_PERPLEXITY_CLASS = []  # the Keras metric class, defined (and registered) on first use


def perplexity_metric(name: str = "perplexity"):
    """A new streaming perplexity metric: exp(mean next-token cross-entropy of the logits).

    Its class is registered with Keras as `tftrain>Perplexity` the first time this is called
    (building a `LanguageModelTask` does), so a SavedModel compiled with it loads cleanly.
    """
    if not _PERPLEXITY_CLASS:
        import tensorflow as tf
        import tf_keras as keras

        @keras.saving.register_keras_serializable(package="tftrain")
        class Perplexity(keras.metrics.Mean):
            """exp(the mean sparse cross-entropy of logits over every position seen)."""

            def update_state(self, y_true, y_pred, sample_weight=None):
                losses = keras.losses.sparse_categorical_crossentropy(
                    y_true, tf.cast(y_pred, tf.float32), from_logits=True)
                return super().update_state(losses, sample_weight)

            def result(self):
                return tf.exp(super().result())

        _PERPLEXITY_CLASS.append(Perplexity)
    return _PERPLEXITY_CLASS[0](name=name)


def next_token_metrics(logits, labels) -> dict[str, float]:
    """Cross-entropy (`loss`), `perplexity` and next-token `accuracy` of `logits`
    [..., vocab] against token ids `labels` [...], over every position, in float64."""
    logits = np.asarray(logits)
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    if not labels.size:
        raise ValueError("no outputs to evaluate: the evaluation dataset is empty")
    logits = logits.reshape(len(labels), -1)
    total, correct = 0.0, 0
    for start in range(0, len(labels), 65536):  # bounded float64 copies
        chunk = logits[start:start + 65536].astype(np.float64)
        truth = labels[start:start + 65536]
        shifted = chunk - chunk.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(shifted).sum(axis=1))
        total += float((log_norm - shifted[np.arange(len(truth)), truth]).sum())
        correct += int((chunk.argmax(axis=1) == truth).sum())
    loss = total / len(labels)
    return {"loss": loss, "perplexity": math.exp(loss), "accuracy": correct / len(labels)}


class LanguageModelTask(Task):
    """Next-token prediction over a vocabulary of `vocab_size` ids (see the module docstring)."""

    name = "language_model"
    losses = ("crossentropy",)
    default_monitor = "val_loss"
    directions = {"loss": "min", "perplexity": "min", "accuracy": "max"}
    reported = ("loss", "perplexity", "accuracy")
    measure = "perplexity"
    change_name = "metric_change"
    gate_flag = "--max_metric_change"

    def __init__(self, info: dict, loss: str = "auto", vocab_size: int = 0):
        super().__init__(info, loss)
        self.vocab_size = int(vocab_size or info.get("vocab_size") or 0)
        perplexity_metric()  # registers the metric's class before any SavedModel is loaded

    def outputs(self):
        from tftrain.models.outputs import OutputSpec

        return OutputSpec(size=self.vocab_size, kind="logits")

    def loss(self, model=None):
        import tf_keras as keras

        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def metrics(self) -> list:
        import tf_keras as keras

        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy"), perplexity_metric()]

    def evaluate(self, outputs, labels) -> dict[str, float]:
        return next_token_metrics(outputs, labels)

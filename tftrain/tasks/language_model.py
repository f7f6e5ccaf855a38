"""Language modeling: vocabulary logits at every position, next-token cross-entropy, perplexity.

The dataset is windows of token ids (`pipelines.text`): the inputs are a window's first
`sequence_length` tokens, the labels the same window shifted by one, so each position's label is
the token after it. The loss is the mean categorical cross-entropy over every position (from
logits; `task.label_smoothing` smooths the targets over the vocabulary, in the loss only);
`perplexity` is the exponential of the unsmoothed cross-entropy over the whole evaluation split
(a streaming Keras metric, `perplexity_metric`), and `accuracy` the fraction of positions whose
most likely next token is the right one (next-token accuracy). Prune and quantize gate on the
relative perplexity increase (`--max_metric_change`, 0.05: 5% higher).

`bits_per_byte` (`bits_per_byte_metric`) is the split's summed cross-entropy in bits divided by
the UTF-8 bytes of the text its targets stand for (the manifest's `info["token_bytes"]`, one
number per token id). Unlike perplexity, which is per token, it does not depend on how the text
was cut into tokens, so it compares models with different tokenizers. A dataset converted
without `token_bytes` gets no bits_per_byte at all.
"""
from __future__ import annotations

import math

import numpy as np

from tftrain.tasks import soft_targets
from tftrain.tasks.base import Task

_METRIC_CLASSES: dict = {}  # the Keras metric classes by name, defined (registered) on first use


def metric_classes() -> dict:
    """The language-model Keras metric classes, `{"perplexity": Perplexity, "bits_per_byte":
    BitsPerByte}`, registered with Keras (`tftrain>Perplexity`, `tftrain>BitsPerByte`) on the
    first call (building a `LanguageModelTask` makes it), so a SavedModel compiled with them
    loads cleanly."""
    if not _METRIC_CLASSES:
        import tensorflow as tf
        import tf_keras as keras

        def crossentropy(y_true, y_pred):
            return keras.losses.sparse_categorical_crossentropy(
                y_true, tf.cast(y_pred, tf.float32), from_logits=True)

        # The metrics' methods branch on Python values only: AutoGraph, which Keras applies to
        # them, would only spend a process's CPU rewriting their source.
        plain = tf.autograph.experimental.do_not_convert

        @keras.saving.register_keras_serializable(package="tftrain")
        class Perplexity(keras.metrics.Mean):
            """exp(the mean sparse cross-entropy of logits over every position seen)."""

            @plain
            def update_state(self, y_true, y_pred, sample_weight=None):
                return super().update_state(crossentropy(y_true, y_pred), sample_weight)

            @plain
            def result(self):
                return tf.exp(super().result())

        @keras.saving.register_keras_serializable(package="tftrain")
        class BitsPerByte(keras.metrics.Metric):
            """The summed cross-entropy of logits over every position seen, in bits, divided
            by the summed UTF-8 bytes of the target ids (`token_bytes[id]`); NaN without bytes."""

            def __init__(self, token_bytes, name="bits_per_byte", dtype=None, **kwargs):
                super().__init__(name=name, dtype=dtype, **kwargs)
                # numpy, not a list: Keras would wrap and track a list attribute
                self.token_bytes = np.asarray(token_bytes, np.float64).reshape(-1)
                self.nats = self.add_weight("nats", initializer="zeros", dtype=tf.float32)
                self.bytes = self.add_weight("bytes", initializer="zeros", dtype=tf.float32)

            @plain
            def update_state(self, y_true, y_pred, sample_weight=None):
                nats = crossentropy(y_true, y_pred)
                ids = tf.cast(tf.reshape(y_true, tf.shape(nats)), tf.int32)
                sizes = tf.gather(tf.constant(self.token_bytes, tf.float32), ids)
                if sample_weight is not None:
                    weight = tf.cast(sample_weight, tf.float32)
                    while weight.shape.rank is not None and weight.shape.rank < nats.shape.rank:
                        weight = tf.expand_dims(weight, -1)
                    nats, sizes = nats * weight, sizes * weight
                return tf.group(self.nats.assign_add(tf.reduce_sum(nats)),
                                self.bytes.assign_add(tf.reduce_sum(sizes)))

            @plain
            def result(self):
                bits = self.nats / math.log(2.0)
                return tf.where(self.bytes > 0, bits / tf.maximum(self.bytes, 1e-30),
                                tf.constant(math.nan, tf.float32))

            def get_config(self):
                return {**super().get_config(), "token_bytes": self.token_bytes.tolist()}

        _METRIC_CLASSES.update(perplexity=Perplexity, bits_per_byte=BitsPerByte)
    return _METRIC_CLASSES


def perplexity_metric(name: str = "perplexity"):
    """A new streaming perplexity metric: exp(mean next-token cross-entropy of the logits)."""
    return metric_classes()["perplexity"](name=name)


def bits_per_byte_metric(token_bytes, name: str = "bits_per_byte"):
    """A new streaming bits-per-byte metric: the summed next-token cross-entropy of the logits
    in bits over the summed `token_bytes` of the target ids (see the module docstring)."""
    return metric_classes()["bits_per_byte"](token_bytes, name=name)


def next_token_metrics(logits, labels, token_bytes=None,
                       label_smoothing: float = 0.0) -> dict[str, float]:
    """Cross-entropy (`loss`, its targets smoothed by `label_smoothing` as in training),
    `perplexity` (never smoothed) and next-token `accuracy` of `logits` [..., vocab] against
    token ids `labels` [...], over every position, in float64; with `token_bytes` (the UTF-8
    bytes of each id) also `bits_per_byte`."""
    logits = np.asarray(logits)
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    if not labels.size:
        raise ValueError("no outputs to evaluate: the evaluation dataset is empty")
    logits = logits.reshape(len(labels), -1)
    total, uniform, correct = 0.0, 0.0, 0
    for start in range(0, len(labels), 65536):  # bounded float64 copies
        chunk = logits[start:start + 65536].astype(np.float64)
        truth = labels[start:start + 65536]
        shifted = chunk - chunk.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(shifted).sum(axis=1))
        total += float((log_norm - shifted[np.arange(len(truth)), truth]).sum())
        if label_smoothing:  # the cross-entropy against the uniform target, eps's share
            uniform += float((log_norm - shifted.mean(axis=1)).sum())
        correct += int((chunk.argmax(axis=1) == truth).sum())
    loss = total / len(labels)
    result = {"loss": (1 - label_smoothing) * loss + label_smoothing * uniform / len(labels),
              "perplexity": math.exp(loss)}
    if token_bytes is not None:
        size = float(np.asarray(token_bytes, np.float64)[labels].sum())
        result["bits_per_byte"] = total / math.log(2.0) / size if size > 0 else math.nan
    return {**result, "accuracy": correct / len(labels)}


class LanguageModelTask(Task):
    """Next-token prediction over a vocabulary of `vocab_size` ids (see the module docstring)."""

    name = "language_model"
    losses = ("crossentropy",)
    default_monitor = "val_loss"
    directions = {"loss": "min", "perplexity": "min", "bits_per_byte": "min", "accuracy": "max"}
    reported = ("loss", "perplexity", "bits_per_byte", "accuracy")
    measure = "perplexity"
    change_name = "metric_change"
    gate_flag = "--max_metric_change"

    def __init__(self, info: dict, loss: str = "auto", vocab_size: int = 0,
                 label_smoothing: float = 0.0):
        super().__init__(info, loss)
        self.label_smoothing = label_smoothing  # over the vocabulary, in the loss only
        self.vocab_size = int(vocab_size or info.get("vocab_size") or 0)
        # The UTF-8 bytes of each token id (the manifest's), or None: no bits_per_byte.
        self.token_bytes = info.get("token_bytes") or None
        metric_classes()  # registers the metrics' classes before any SavedModel is loaded

    def outputs(self):
        from tftrain.models.outputs import OutputSpec

        return OutputSpec(size=self.vocab_size, kind="logits")

    def loss(self, model=None):
        """Cross-entropy of the logits against the next token ids (`soft_targets`: sparse,
        one-hot over the vocabulary only to smooth it)."""
        return soft_targets.keras_classes()["loss"](label_smoothing=self.label_smoothing)

    def metrics(self) -> list:
        import tf_keras as keras

        metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy"), perplexity_metric()]
        if self.token_bytes:
            metrics.append(bits_per_byte_metric(self.token_bytes))
        return metrics

    def evaluate(self, outputs, labels) -> dict[str, float]:
        return next_token_metrics(outputs, labels, self.token_bytes, self.label_smoothing)

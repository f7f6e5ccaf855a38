"""Class targets as integer ids or as soft targets: the Keras loss and accuracy that take both.

A classifier's labels are integer class ids, [batch] or [batch, 1] (every split as read), or
float soft targets [batch, num_classes] (a training batch that mixup/cutmix mixed, `data.augment`).
Keras traces the train and the test step separately, so each trace decides by the targets' static
shape: the same rank as the outputs with their number of classes is a soft target, anything else
ids. `ClassCrossentropy` keeps ids sparse (no one-hot) unless label smoothing needs the one-hot;
`ClassAccuracy` compares the argmax of a soft target (Keras's "accuracy" string would pick one
form at its first call and apply it to the other split too).

Label smoothing (`task.label_smoothing` = eps) trains on `y * (1 - eps) + eps / K` for a target
`y` over K classes, in the loss only (tf-keras's CategoricalCrossentropy does exactly this;
its SparseCategoricalCrossentropy has no smoothing). The classes are registered with Keras
(`tftrain>ClassCrossentropy`, `tftrain>ClassAccuracy`) on the first call of `keras_classes`, so
a SavedModel compiled with them loads.
"""
from __future__ import annotations

from tftrain.errors import ConfigError

_CLASSES: dict = {}


def check_setting(smoothing: float, task_type: str, why: str = "") -> None:
    """Raises ConfigError unless `task.label_smoothing` is in [0, 1) and, when on, the task
    (`task_type`; `why`: where it came from) has classes to smooth over."""
    if not 0 <= smoothing < 1:
        raise ConfigError(f"task.label_smoothing={smoothing} must be in [0, 1) (0: off; 0.1 is "
                          "the usual value for ImageNet classifiers)")
    if smoothing and task_type == "regression":
        raise ConfigError(f"task.label_smoothing={smoothing} smooths class targets, and "
                          f"task.type=regression{why} has none: remove task.label_smoothing "
                          "(or set it to 0)")


def keras_classes() -> dict:
    """`{"loss": ClassCrossentropy, "accuracy": ClassAccuracy}`, defined and registered with
    Keras on the first call (importing this module does not import TensorFlow)."""
    if _CLASSES:
        return _CLASSES
    import tensorflow as tf
    import tf_keras as keras

    @keras.saving.register_keras_serializable(package="tftrain")
    class ClassCrossentropy(keras.losses.Loss):
        """Cross-entropy of class scores (`from_logits`, else probabilities) against ids or
        soft targets, with `label_smoothing` (see the module docstring); float32 throughout."""

        def __init__(self, from_logits=True, label_smoothing=0.0,
                     reduction=keras.losses.Reduction.AUTO, name="class_crossentropy"):
            super().__init__(reduction=reduction, name=name)
            self.from_logits = bool(from_logits)
            self.label_smoothing = float(label_smoothing)

        def call(self, y_true, y_pred):
            y_true = tf.convert_to_tensor(y_true)
            y_pred = tf.cast(y_pred, tf.float32)  # a float16 model's scores: reduce in float32
            if is_soft(y_true, y_pred):
                targets = tf.cast(y_true, tf.float32)
            elif self.label_smoothing:
                ids = tf.reshape(tf.cast(y_true, tf.int32), tf.shape(y_pred)[:-1])
                targets = tf.one_hot(ids, tf.shape(y_pred)[-1], dtype=tf.float32)
            else:
                return keras.losses.sparse_categorical_crossentropy(
                    y_true, y_pred, from_logits=self.from_logits)
            return keras.losses.categorical_crossentropy(
                targets, y_pred, from_logits=self.from_logits,
                label_smoothing=self.label_smoothing)

        def get_config(self):
            return {**super().get_config(), "from_logits": self.from_logits,
                    "label_smoothing": self.label_smoothing}

    def top_k_hits(y_true, y_pred, k):
        y_pred = tf.cast(y_pred, tf.float32)
        if y_pred.shape[-1] == 1:  # one sigmoid unit: class 1 above 0.5
            hit = tf.equal(tf.cast(y_pred > 0.5, tf.int64),
                           tf.cast(tf.reshape(y_true, tf.shape(y_pred)), tf.int64))
            return tf.cast(tf.squeeze(hit, -1), tf.float32)
        if is_soft(y_true, y_pred):
            ids = tf.argmax(y_true, axis=-1, output_type=tf.int32)
        else:
            ids = tf.reshape(tf.cast(y_true, tf.int32), tf.shape(y_pred)[:-1])
        if k == 1:
            return tf.cast(tf.equal(ids, tf.argmax(y_pred, -1, output_type=tf.int32)),
                           tf.float32)
        rows = tf.reshape(y_pred, [-1, tf.shape(y_pred)[-1]])
        hits = tf.math.in_top_k(tf.reshape(ids, [-1]), rows, k)
        return tf.reshape(tf.cast(hits, tf.float32), tf.shape(ids))

    @keras.saving.register_keras_serializable(package="tftrain")
    class ClassAccuracy(keras.metrics.Mean):
        """The fraction of examples whose class (the argmax of a soft target) is among the `k`
        highest scores: `k=1` is accuracy, `k=5` top-5 accuracy."""

        def __init__(self, k=1, name="accuracy", dtype=None):
            super().__init__(name=name, dtype=dtype)
            self.k = int(k)

        # branches on static shapes only: AutoGraph would only spend time rewriting the source
        @tf.autograph.experimental.do_not_convert
        def update_state(self, y_true, y_pred, sample_weight=None):
            hits = top_k_hits(tf.convert_to_tensor(y_true), tf.convert_to_tensor(y_pred), self.k)
            return super().update_state(hits, sample_weight)

        def get_config(self):
            return {"k": self.k, "name": self.name, "dtype": self.dtype}

    _CLASSES.update(loss=ClassCrossentropy, accuracy=ClassAccuracy)
    return _CLASSES


def is_soft(y_true, y_pred) -> bool:
    """Whether the targets `y_true` are soft (one float per class, as `y_pred` has), by their
    static shapes; ids ([batch], [batch, 1], or one per position of a sequence) otherwise."""
    classes = y_pred.shape[-1]
    return (y_true.shape.rank is not None and y_true.shape.rank == y_pred.shape.rank
            and classes is not None and classes > 1 and y_true.shape[-1] == classes)

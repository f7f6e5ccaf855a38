"""Self-distillation while fine-tuning: the float model teaches its compressed copy.

A pruned copy fine-tuned on the labels alone drifts from the model it came from: on a small test
split, one or two examples that the float model got right flip, which is a whole point of
accuracy. Trained to match the float model's softened class scores as well (Hinton et al., 2015,
"Distilling the Knowledge in a Neural Network"), the copy keeps the float model's decisions,
which is what a compression pass is judged on.

`with_teacher` builds the model that `fit` trains: the student and the frozen teacher side by
side on the same inputs, their scores concatenated; `DistillationLoss` splits them again. The
loss stays a Keras loss, so `fit`, distribution strategies and loss scaling work as usual, and
the student (whose layers the wrapper shares) is what gets exported.
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

DEFAULT_WEIGHT = 0.5
DEFAULT_TEMPERATURE = 2.0


def distillable(model: keras.Model, loss) -> bool:
    """Whether `model` is a classifier with class scores on its one output (more than one class)
    trained with sparse categorical cross-entropy: what `DistillationLoss` supports."""
    outputs = model.outputs or []
    return (len(outputs) == 1 and outputs[0].shape.rank == 2 and (outputs[0].shape[-1] or 0) > 1
            and isinstance(loss, keras.losses.SparseCategoricalCrossentropy))


def with_teacher(student: keras.Model, teacher: keras.Model) -> keras.Model:
    """A model whose output is `[student scores, teacher scores]` (concatenated on the last
    axis). The teacher runs in inference mode (no dropout, frozen batch statistics) and is not
    trained; the student's layers are shared, so training the wrapper trains `student`."""
    # The same layers under another name: both models are often called e.g. "cnn".
    teacher = keras.Model(teacher.inputs, teacher.outputs, name=f"{teacher.name}_teacher")
    teacher.trainable = False
    inputs = tf.nest.map_structure(
        lambda t: keras.Input(shape=t.shape[1:], dtype=t.dtype, name=t.name.split(":")[0]),
        student.input)
    student_scores = tf.cast(student(inputs), tf.float32)
    teacher_scores = tf.stop_gradient(tf.cast(teacher(inputs, training=False), tf.float32))
    return keras.Model(inputs, keras.layers.Concatenate(axis=-1)([student_scores,
                                                                  teacher_scores]),
                       name=f"{student.name}_distilled")


class DistillationLoss(keras.losses.Loss):
    """`(1 - weight) * hard_loss(labels, student) + weight * T² * KL(teacher_T || student_T)`
    on the concatenated scores of `with_teacher`, where `_T` are the class distributions at
    temperature `T` (the T² keeps the soft term's gradients on the scale of the hard one's).

    Args:
      hard_loss: the student's own `SparseCategoricalCrossentropy`; its `from_logits` says
        whether the scores are logits or probabilities (probabilities are turned into logits
        with a log, which leaves the distributions unchanged).
      weight: the share of the soft term, in [0, 1].
      temperature: T > 0; above 1 it softens both distributions.
    """

    def __init__(self, hard_loss, weight: float = DEFAULT_WEIGHT,
                 temperature: float = DEFAULT_TEMPERATURE, name: str = "distillation"):
        super().__init__(name=name)
        self.hard_loss = hard_loss
        self.weight = float(weight)
        self.temperature = float(temperature)
        self.from_logits = bool(hard_loss.get_config().get("from_logits", False))

    def call(self, y_true, y_pred):
        student, teacher = tf.split(y_pred, 2, axis=-1)
        hard = keras.losses.sparse_categorical_crossentropy(y_true, student,
                                                            from_logits=self.from_logits)
        if not self.from_logits:
            student = tf.math.log(tf.maximum(student, 1e-7))
            teacher = tf.math.log(tf.maximum(teacher, 1e-7))
        t = self.temperature
        teacher_probs = tf.nn.softmax(teacher / t)
        soft = tf.reduce_sum(
            teacher_probs * (tf.nn.log_softmax(teacher / t) - tf.nn.log_softmax(student / t)),
            axis=-1) * t * t
        return (1.0 - self.weight) * hard + self.weight * soft

    def get_config(self):
        return {"name": self.name, "weight": self.weight, "temperature": self.temperature}

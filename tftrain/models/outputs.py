"""The contract between a task and a model: what the model's last layer gives (`OutputSpec`).

A leaf: tasks say what they need with it, builders make the head from it, and neither imports
the other for it.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """What the model's last layer gives per example: `size` float32 values.

    `kind="logits"`: class logits (`size` classes). `kind="values"`: regression values in the
    label's units; with `mean` and `std` (per output, or one for all, measured at conversion)
    the head predicts standardized values and scales them back, so training sees unit-scale
    targets.
    """

    size: int
    kind: str = "logits"
    mean: tuple = ()
    std: tuple = ()

    def head(self, x):
        """The output layer(s) on the features `x`; float32 even under a mixed-precision policy
        (the loss must not be computed in fp16)."""
        import tf_keras as keras

        if self.kind == "logits":
            return keras.layers.Dense(self.size, dtype="float32", name="logits")(x)
        x = keras.layers.Dense(self.size, dtype="float32", name="standardized")(x)
        if not self.std:
            return x
        scale = list(self.std) if len(self.std) > 1 else self.std[0]
        offset = list(self.mean) if len(self.mean) > 1 else self.mean[0]
        return keras.layers.Rescaling(scale, offset, dtype="float32", name="values")(x)


def as_output_spec(outputs) -> OutputSpec:
    """`outputs` as an OutputSpec: an int is a number of classes (the call before tasks)."""
    return outputs if isinstance(outputs, OutputSpec) else OutputSpec(size=int(outputs))

"""Regression: real-valued outputs in the label's units; MSE, MAE or Huber; MAE, RMSE and R².

The head predicts standardized values and scales them back with the label's mean and standard
deviation measured at conversion (the manifest's `info["label_stats"]`, see `models.OutputSpec`),
so the optimizer sees targets of unit scale whatever their units, and the exported model answers
in the label's units. `task.loss=huber` puts its threshold at one standard deviation of the label.
Prune and quantize gate on the relative RMSE increase (`--max_metric_change`, 0.05: 5% worse).
"""
from __future__ import annotations

import math

import numpy as np

from tftrain.tasks.base import Task, as_rows


def regression_metrics(outputs, labels) -> dict[str, float]:
    """MSE, RMSE, MAE and R² (the mean over outputs of 1 - SSE/SST, as scikit-learn's
    `r2_score` averages them) of `outputs` against `labels`, in float64."""
    predicted = as_rows(outputs, "outputs")
    truth = as_rows(labels, "labels").reshape(predicted.shape)
    errors = predicted - truth
    mse = float(np.mean(errors ** 2))
    total = ((truth - truth.mean(axis=0)) ** 2).sum(axis=0)
    residual = (errors ** 2).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):  # a constant label has no R² (nan)
        r2 = np.where(total > 0, 1.0 - residual / np.where(total > 0, total, 1.0), np.nan)
    return {"mse": mse, "rmse": math.sqrt(mse), "mae": float(np.mean(np.abs(errors))),
            "r2": float(np.mean(r2))}


def huber(errors: np.ndarray, delta: float) -> float:
    """The mean Huber loss of `errors` with threshold `delta` (Keras's definition)."""
    small = np.abs(errors) <= delta
    return float(np.mean(np.where(small, 0.5 * errors ** 2,
                                  delta * np.abs(errors) - 0.5 * delta ** 2)))


class RegressionTask(Task):
    """One value per label entry (see the module docstring)."""

    name = "regression"
    losses = ("mse", "mae", "huber")
    default_monitor = "val_rmse"
    directions = {"loss": "min", "rmse": "min", "mae": "min", "r2": "max"}
    reported = ("loss", "mse", "rmse", "mae", "r2")
    measure = "rmse"
    change_name = "metric_change"
    gate_flag = "--max_metric_change"

    def __init__(self, info: dict, loss: str = "auto", shape=(), mean=None, std=None):
        super().__init__(info, loss)
        self.size = max(1, math.prod(shape))
        self.mean = tuple(float(m) for m in np.ravel(mean)) if mean is not None else ()
        self.std = tuple(float(s) for s in np.ravel(std)) if std is not None else ()
        if len(self.mean) not in (0, 1, self.size) or len(self.std) != len(self.mean):
            self.mean = self.std = ()  # statistics that do not fit the outputs: not used

    def outputs(self):
        from tftrain.models.outputs import OutputSpec

        return OutputSpec(size=self.size, kind="values", mean=self.mean, std=self.std)

    @property
    def huber_delta(self) -> float:
        return float(np.mean(self.std)) if self.std else 1.0

    def loss(self, model=None):
        import tf_keras as keras

        if self.loss_name == "mae":
            return keras.losses.MeanAbsoluteError()
        if self.loss_name == "huber":
            return keras.losses.Huber(delta=self.huber_delta)
        return keras.losses.MeanSquaredError()

    def metrics(self) -> list:
        import tf_keras as keras

        from tftrain.tasks.r2_metric import R2

        return [keras.metrics.RootMeanSquaredError(name="rmse"),
                keras.metrics.MeanAbsoluteError(name="mae"), R2(self.size, name="r2")]

    def evaluate(self, outputs, labels) -> dict[str, float]:
        result = regression_metrics(outputs, labels)
        if self.loss_name == "mse":
            loss = result["mse"]
        elif self.loss_name == "mae":
            loss = result["mae"]
        else:
            predicted = as_rows(outputs, "outputs")
            errors = predicted - as_rows(labels, "labels").reshape(predicted.shape)
            loss = huber(errors, self.huber_delta)
        return {"loss": loss, **result}

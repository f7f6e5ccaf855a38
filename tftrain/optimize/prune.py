"""Magnitude pruning with `prune_low_magnitude`, and per-layer sparsity reports.

The pitfalls this module exists for (DESIGN.md §5): the pruning mask only updates every
`frequency` steps (default 100: with fewer steps sparsity silently stays 0), so `frequency` and
`end_step` are derived from the real number of steps; pruning modifies the layers it wraps, so a
float32 clone is pruned; `UpdatePruningStep` is always installed; wrappers are stripped; and
2:4 sparsity silently skips some layers, so sparsity is measured on the weights, per layer.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import tf_keras as keras
from absl import logging

from tftrain.errors import ConfigError, TftrainError
from tftrain.optimize import distill
from tftrain.optimize import finetune as finetune_lib
from tftrain.optimize.keras_model import clone_float32
from tftrain.optimize.tfmot_lib import prune_registry, pruning_wrapper, tfmot

SCHEDULES = ("polynomial", "constant")
# Fraction of the fine-tuning steps spent ramping sparsity up; the rest recovers accuracy.
_RAMP_FRACTION = 2 / 3
_MASK_UPDATES = 8
# Layers whose kernels hold fewer weights stay dense by default: typically the first convolution
# and the classifier, a small part of the model's size and a large part of its accuracy.
DEFAULT_MIN_WEIGHTS = 2048


# Measured on the digits demo (189 test examples; with self-distillation): 600 steps lost 2
# examples (1.06 pt, over the 1 pt bar) in 1 of 2 runs from a float model at 187/189, 1200 steps
# 0 or 1 example in 6 of 6 runs from that model (a faster sparsity ramp, or a tenth of the rate,
# lost 2-3). Without distillation, 440 steps lost 1.06 pt in 1 of 5 runs.
MIN_FINETUNE_STEPS = 1200
MIN_FINETUNE_EPOCHS = 2


def finetune_epochs(steps_per_epoch: int) -> int:
    """The default fine-tuning length, in epochs of the training split: at least
    `MIN_FINETUNE_EPOCHS`, and at least `MIN_FINETUNE_STEPS` steps, so that a small dataset gets
    enough mask updates and recovery steps and a large one is not fine-tuned for many epochs."""
    return max(MIN_FINETUNE_EPOCHS, -(-MIN_FINETUNE_STEPS // max(1, steps_per_epoch)))


def check_target_sparsity(target: float) -> float:
    """Returns `target` when it is a fraction strictly between 0 and 1, else raises ConfigError."""
    if not 0.0 < target < 1.0:
        raise ConfigError(f"--target_sparsity={target} is outside (0, 1): it is the fraction of "
                          "weights set to zero, e.g. 0.8 for 80%.")
    return float(target)


def parse_m_by_n(text: str | None) -> tuple[int, int] | None:
    """Parses `"2:4"` (m zeros in every n consecutive weights) into `(2, 4)`; `""` gives None."""
    if not text:
        return None
    try:
        m, n = (int(part) for part in text.split(":"))
    except ValueError:
        raise ConfigError(f"--sparsity_m_by_n={text!r} is not M:N (e.g. 2:4)") from None
    if not 0 < m < n:
        raise ConfigError(f"--sparsity_m_by_n={text!r}: need 0 < M < N (e.g. 2:4)")
    return m, n


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When masks update: every `frequency` steps from step 0 up to `end_step` (inclusive)."""

    kind: str
    target_sparsity: float
    total_steps: int
    end_step: int
    frequency: int

    def build(self) -> tfmot.sparsity.keras.PruningSchedule:
        """The TFMOT schedule object."""
        if self.kind == "constant":
            return tfmot.sparsity.keras.ConstantSparsity(
                self.target_sparsity, begin_step=0, end_step=self.end_step,
                frequency=self.frequency)
        return tfmot.sparsity.keras.PolynomialDecay(
            initial_sparsity=0.0, final_sparsity=self.target_sparsity, begin_step=0,
            end_step=self.end_step, frequency=self.frequency)


def make_schedule(kind: str, target_sparsity: float, total_steps: int) -> Schedule:
    """Derives `end_step` and `frequency` from the number of fine-tuning steps.

    Sparsity ramps up over the first two thirds of the steps with about eight mask updates, and
    `end_step` is a multiple of `frequency`, so the last update lands exactly on the target.
    """
    if kind not in SCHEDULES:
        raise ConfigError(f"unknown pruning schedule {kind!r}; choose one of "
                          f"{', '.join(SCHEDULES)}")
    check_target_sparsity(target_sparsity)
    if total_steps < 1:
        raise ConfigError(f"pruning needs at least one fine-tuning step, got {total_steps}")
    ramp = max(1, int(total_steps * _RAMP_FRACTION))
    frequency = max(1, ramp // _MASK_UPDATES)
    end_step = max(frequency, ramp // frequency * frequency)
    return Schedule(kind, target_sparsity, total_steps, end_step, frequency)


def kernel_weights(layer) -> int:
    """How many weights `layer`'s kernels (weights of rank 2 or more) hold."""
    return sum(w.shape.num_elements() for w in layer.weights if w.shape.rank >= 2)


def _wrap_for_pruning(schedule, m_by_n, min_weights: int, skipped: list[str], small: list[str]):
    """A `clone_model` function wrapping every layer TFMOT can prune (recursing into models),
    except layers with fewer than `min_weights` kernel weights."""

    def wrap(layer):
        if isinstance(layer, keras.Model):
            return keras.models.clone_model(layer, clone_function=wrap)
        if isinstance(layer, keras.layers.InputLayer):
            return layer
        if 0 < kernel_weights(layer) < min_weights:
            small.append(layer.name)
            return layer
        if not prune_registry.PruneRegistry.supports(layer):
            if layer.weights:
                skipped.append(layer.name)
            return layer
        return tfmot.sparsity.keras.prune_low_magnitude(
            layer, pruning_schedule=schedule, sparsity_m_by_n=m_by_n)

    return wrap


def _pruned_weight_names(model) -> set[str]:
    """Names of the weights the pruning wrappers of `model` mask."""
    names = set()
    for layer in leaf_layers(model):
        if isinstance(layer, pruning_wrapper.PruneLowMagnitude):
            names.update(weight.name for weight, _, _ in layer.pruning_vars)
    return names


def leaf_layers(model):
    """Every layer of `model` that is not itself a model, in order (nested models flattened)."""
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from leaf_layers(layer)
        else:
            yield layer


@dataclasses.dataclass
class PruneResult:
    """A stripped pruned model and how it was made."""

    model: keras.Model
    schedule: Schedule
    m_by_n: tuple[int, int] | None
    pruned_weights: set[str]
    unsupported_layers: list[str]
    small_layers: list[str]  # left dense: fewer than `min_weights` kernel weights
    distilled: bool = False  # fine-tuned to match the float model's scores too


def prune_model(model: keras.Model, train_data, *, steps_per_epoch: int, epochs: int,
                target_sparsity: float = 0.8, m_by_n: tuple[int, int] | None = None,
                schedule: str = "polynomial", loss=None, learning_rate: float = 1e-3,
                min_weights: int = DEFAULT_MIN_WEIGHTS, optimizer_fn=None, strategy=None,
                distill_weight: float = distill.DEFAULT_WEIGHT,
                temperature: float = distill.DEFAULT_TEMPERATURE, verbose: int = 0) -> PruneResult:
    """Fine-tunes a pruned float32 clone of `model` and returns it stripped of its wrappers.

    `model` is never modified. `train_data` must yield `steps_per_epoch` batches per epoch; the
    schedule's `frequency` and `end_step` come from `steps_per_epoch * epochs`. With `m_by_n`
    (e.g. `(2, 4)`), every block of n consecutive input-channel weights keeps at most n - m
    non-zeros instead of following `target_sparsity`. Layers whose kernels hold fewer than
    `min_weights` weights stay dense (0: prune every layer). `optimizer_fn()` (default Adam at
    `learning_rate`) is called under the strategy scope. With `distill_weight` > 0, a classifier
    is fine-tuned to match `model`'s scores too (`distill`: the share of that term and its
    temperature); other models on their loss alone.
    """
    check_target_sparsity(target_sparsity)
    if not 0.0 <= distill_weight <= 1.0 or temperature <= 0:
        raise ConfigError(f"distillation needs a weight in [0, 1] and a temperature > 0, got "
                          f"--distill_weight={distill_weight} --distill_temperature={temperature}")
    plan = make_schedule(schedule, target_sparsity, steps_per_epoch * epochs)
    logging.info("pruning schedule: %s", plan)
    loss = loss or finetune_lib.training_loss(model)
    skipped: list[str] = []
    small: list[str] = []
    with finetune_lib.strategy_scope(strategy):
        clone = clone_float32(model)
        try:
            pruned = keras.models.clone_model(clone, clone_function=_wrap_for_pruning(
                plan.build(), m_by_n, min_weights, skipped, small))
        except ValueError as e:
            raise TftrainError(f"cannot wrap model {model.name!r} for pruning: {e}") from e
        optimizer = optimizer_fn() if optimizer_fn else None
        trainee, trainee_loss = pruned, loss
        if distill_weight and distill.distillable(pruned, loss):
            trainee = distill.with_teacher(pruned, clone_float32(model))
            trainee_loss = distill.DistillationLoss(loss, distill_weight, temperature)
    if skipped:
        logging.warning("layers TFMOT cannot prune, left dense: %s", ", ".join(skipped))
    if small:
        logging.info("layers with fewer than %d kernel weights, left dense: %s", min_weights,
                     ", ".join(small))
    pruned_names = _pruned_weight_names(pruned)
    if not pruned_names:
        hint = (f"; every prunable layer has fewer than {min_weights} kernel weights: lower "
                "--min_weights_to_prune" if small else "")
        raise TftrainError(f"model {model.name!r} has no layer TFMOT can prune (Dense, Conv, ...)"
                           + hint)
    finetune_lib.finetune(trainee, train_data, epochs=epochs, steps_per_epoch=steps_per_epoch,
                          loss=trainee_loss, learning_rate=learning_rate, optimizer=optimizer,
                          callbacks=[tfmot.sparsity.keras.UpdatePruningStep()],
                          strategy=strategy, verbose=verbose)
    with finetune_lib.strategy_scope(strategy):
        stripped = tfmot.sparsity.keras.strip_pruning(pruned)
    return PruneResult(stripped, plan, m_by_n, pruned_names, skipped, small,
                       distilled=trainee is not pruned)


def m_by_n_ok(kernel: np.ndarray, m_by_n: tuple[int, int]) -> bool | None:
    """Whether every block of n consecutive input-channel weights has at least m zeros.

    Dense kernels are `[in, out]`, convolution kernels `[h, w, in, out]`; blocks run along `in`
    for each output (TFLite's layout). Returns None when `in` is not a multiple of n (such a
    layer cannot hold the structure and TFMOT leaves it mostly dense).
    """
    m, n = m_by_n
    kernel = np.asarray(kernel)
    if kernel.ndim not in (2, 4) or kernel.shape[-2] % n:
        return None
    rows = np.moveaxis(kernel, -1, 0).reshape(-1, kernel.shape[-2])
    blocks = rows.reshape(-1, n)
    return bool(((blocks == 0).sum(axis=1) >= m).all())


def sparsity_report(model: keras.Model, pruned_weights: set[str] | None = None,
                    m_by_n: tuple[int, int] | None = None) -> dict:
    """Per-layer and overall sparsity and parameter counts of `model`'s weights.

    `pruned_weights` (weight names) selects the weights counted in `sparsity`; by default every
    kernel (weights of rank 2 or more). With `m_by_n`, each layer says whether its kernel holds
    the m:n structure (`null` when its input channels are not a multiple of n).
    """
    layers, zeros, counted = [], 0, 0
    num_params = num_nonzero = 0
    for layer in leaf_layers(model):
        if not layer.weights:
            continue
        entry = {"layer": layer.name, "class": type(layer).__name__, "params": 0,
                 "nonzero_params": 0}
        for weight in layer.weights:
            value = weight.numpy()
            entry["params"] += value.size
            entry["nonzero_params"] += int(np.count_nonzero(value))
            if pruned_weights is not None:
                selected = weight.name in pruned_weights
            else:
                selected = value.ndim >= 2
            if not selected:
                continue
            layer_zeros = int(value.size - np.count_nonzero(value))
            entry.setdefault("weights", []).append(weight.name)
            entry["weight_params"] = entry.get("weight_params", 0) + int(value.size)
            entry["zeros"] = entry.get("zeros", 0) + layer_zeros
            entry["sparsity"] = entry["zeros"] / entry["weight_params"]
            if m_by_n:
                ok = m_by_n_ok(value, m_by_n)
                entry["m_by_n_ok"] = ok if entry.get("m_by_n_ok", True) is not False else False
            zeros += layer_zeros
            counted += value.size
        num_params += entry["params"]
        num_nonzero += entry["nonzero_params"]
        layers.append(entry)
    return {"sparsity": zeros / counted if counted else 0.0, "pruned_params": counted,
            "num_params": num_params, "nonzero_params": num_nonzero, "layers": layers}


def check_sparsity_reached(report: dict, target_sparsity: float, m_by_n=None,
                           tolerance: float = 0.02) -> list[str]:
    """Problems with a pruned model's sparsity report (empty when every pruned layer made it)."""
    problems = []
    for entry in report["layers"]:
        if "sparsity" not in entry:
            continue
        if m_by_n:
            if entry.get("m_by_n_ok") is False:
                problems.append(f"layer {entry['layer']} does not hold {m_by_n[0]}:{m_by_n[1]} "
                                "sparsity")
        elif entry["sparsity"] < target_sparsity - tolerance:
            problems.append(f"layer {entry['layer']} reached {entry['sparsity']:.1%} sparsity, "
                            f"target {target_sparsity:.0%}")
    return problems

"""Memory: a rough estimate of one replica's memory in a training step, against its HBM.

The formula (bytes, for one replica: a TPU core on v2/v3, a chip from v4 on):

    params * 4                      the variables, float32 also under mixed precision
  + params * 2 under mixed_*        the bfloat16/float16 copies the layers compute with
  + trainable * 4                   the gradients
  + trainable * 4 * slots           optimizer slots: adam and adamw 2, sgd with momentum 1, sgd 0
  + outputs * batch * b * 2         activations: the sum of every layer's output elements for one
                                    example (from the built model), times one replica's
                                    micro-batch (data.batch_size / replicas), b bytes per element
                                    (2 under mixed precision, else 4), x2 for backprop (outputs
                                    kept for the backward pass, and their gradients)

It is a fair first guess, not XLA's number: XLA fuses some outputs away and adds workspace, and
a TPU pads the two minor dimensions of each tensor to multiples of 8 and 128, so tensors with few
channels take more than they hold. Only the TPU's own compile reports the real figure.
HBM per replica: v2 8 GiB, v3 16 GiB (per core); v4 32 GiB, v5e 16 GiB, v5p 95 GiB, v6e 32 GiB
(per chip; see `hardware`).
"""
from __future__ import annotations

import dataclasses

from tftrain.training.optimizers import optimizer_slots
from tftrain.rules import hardware
from tftrain.rules.report import ADVICE, ERROR, OK, Finding, Target

FAMILY = "memory"
GIB = 1 << 30
TIGHT = 0.8  # above this share of HBM: advice (XLA workspace and padding come on top)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """One replica's estimated memory for a training step, by part (bytes)."""

    params: int
    trainable: int
    slots: int
    state_bytes: int  # weights, compute copies, gradients, optimizer slots
    bytes_per_example: int  # activations of one example, backprop included
    batch: int  # one replica's micro-batch
    unknown_layers: tuple = ()  # layers whose output size is not known (subclassed models)

    @property
    def activation_bytes(self) -> int:
        """Activations of one replica's micro-batch."""
        return self.bytes_per_example * self.batch

    @property
    def total(self) -> int:
        """Everything: state plus activations."""
        return self.state_bytes + self.activation_bytes


def estimate(model, config, target: Target, policy: str) -> Estimate:
    """The estimate for `model` (built) under `policy`, with one replica's micro-batch."""
    import numpy as np

    params = int(model.count_params())
    trainable = int(sum(np.prod(w.shape) for w in model.trainable_weights))
    slots = optimizer_slots(config.train.optimizer)
    mixed = policy.startswith("mixed_")
    state = params * 4 + (params * 2 if mixed else 0) + trainable * 4 * (1 + slots)
    elements, unknown = output_elements(model)
    per_example = elements * (2 if mixed else 4) * 2
    batch = max(config.data.batch_size // target.replicas, 1)
    return Estimate(params, trainable, slots, state, per_example, batch, tuple(unknown))


def output_elements(model) -> tuple[int, list[str]]:
    """Sum of the output elements of one example over every layer's call in the model.

    Nested functional models are walked into; a layer whose output shape is not known (inside
    a subclassed model) is listed instead.
    """
    import numpy as np

    nodes = [node for depth in getattr(model, "_nodes_by_depth", {}).values() for node in depth]
    if not nodes:
        return 0, [model.name]
    total, unknown = 0, []
    for node in nodes:
        layer = node.layer
        if getattr(layer, "_is_graph_network", False) and layer is not model:
            inner, inner_unknown = output_elements(layer)
            total += inner
            unknown += inner_unknown
            continue
        outputs = node.outputs if isinstance(node.outputs, (list, tuple)) else [node.outputs]
        for output in outputs:
            dims = list(output.shape)[1:]
            if any(d is None for d in dims):
                unknown.append(layer.name)
            else:
                total += int(np.prod(dims, dtype=np.int64))
    return total, unknown


def check(found: Estimate, config, target: Target, policy: str) -> Finding:
    """The estimate against the HBM of one replica of `target.tpu_type` (TPU only)."""
    word = target.replica_word
    parts = (f"~{size(found.total)} per {word}: weights, gradients and {found.slots} "
             f"optimizer slot{'s' if found.slots != 1 else ''} of {found.params:,} parameters "
             f"{size(found.state_bytes)} + activations of {found.batch} examples "
             f"{size(found.activation_bytes)} ({policy})")
    if found.unknown_layers:
        parts += f"; output sizes unknown for {', '.join(found.unknown_layers[:3])} (not counted)"
    generation = hardware.GENERATIONS.get(target.tpu_type) if target.kind == "tpu" else None
    if generation is None:
        return Finding(OK, FAMILY, f"estimated {parts}")
    hbm = generation.hbm_gib * GIB
    against = f"{parts}, of the {generation.hbm_gib:g} GiB HBM of a {generation.name} {word}"
    if found.total > hbm:
        return Finding(ERROR, FAMILY, f"does not fit: {against}", _fit_advice(found, config,
                                                                              target, hbm, policy))
    if found.total > TIGHT * hbm:
        return Finding(ADVICE, FAMILY, f"tight: {against} (XLA adds workspace and padding)",
                       _fit_advice(found, config, target, TIGHT * hbm, policy))
    return Finding(OK, FAMILY, f"fits: {against}")


def size(nbytes: float) -> str:
    """'1.25 GiB', '3.4 MiB' or '12 KiB'."""
    if nbytes >= GIB:
        return f"{nbytes / GIB:.2f} GiB"
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.1f} MiB"
    return f"{nbytes / 1024:.0f} KiB"


def _fit_advice(found: Estimate, config, target: Target, budget: float, policy: str) -> str:
    """Smaller batch, bfloat16, or sharding the weights (DTensor), with the numbers."""
    shard = ("shard the weights over several devices with a DTensor mesh (runtime.strategy="
             "dtensor, runtime.mesh=batch:N,model:M; docs/dtensor.md)")
    if found.state_bytes >= budget:
        return (f"the weights and optimizer state alone take {size(found.state_bytes)}: "
                f"{shard}, or a generation with more HBM per {target.replica_word}")
    fits = int((budget - found.state_bytes) // max(found.bytes_per_example, 1))
    fits -= fits % 8 if fits >= 8 else 0
    options = [f"data.batch_size <= {max(fits, 1) * target.replicas} ({max(fits, 1)} per "
               f"{target.replica_word})"]
    if not policy.startswith("mixed_"):
        options.append("runtime.mixed_precision=mixed_bfloat16 (halves the activations)")
    if config.train.grad_accum_steps == 1:
        options.append("the same global batch with train.grad_accum_steps=k and data.batch_size/k")
    return "; ".join(options + [shard])

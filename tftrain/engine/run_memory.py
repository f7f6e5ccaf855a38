"""What a run's model and optimizer hold on one device, measured from their real variables.

summary.json records it for every run (`parameters`, `memory`), and `tftrain check`'s plan is
validated against it: the planned bytes of the weights and of the optimizer state must be these.
Per device means the largest share of any device: the whole variable for a tf.distribute
replica (each holds a copy), a pipeline stage's variables on its device, its shard for a DTensor variable split over mesh dimensions (the
bytes divided by the product of the dimensions its layout names, rounded up). The optimizer's
state is every optimizer variable but its step counter (`iterations`).
"""
from __future__ import annotations

import math

import numpy as np


def _shards(variable) -> int:
    """Into how many pieces `variable` is split (1 unless it is a sharded DTensor variable)."""
    from tensorflow.experimental import dtensor

    if not isinstance(variable, dtensor.DVariable):  # an ordinary (or mirrored) variable
        return 1
    layout = dtensor.fetch_layout(variable)
    sizes = dict(zip(layout.mesh.dim_names, layout.mesh.shape()))
    return math.prod(sizes[name] for name in layout.sharding_specs if name in sizes)


def bytes_by_device(variables) -> dict[str, int]:
    """The bytes of `variables` on each device that holds some (a pipeline stage's variables
    live on its own device; a mirrored or DTensor variable counts on its first device)."""
    totals: dict[str, int] = {}
    for variable in variables:
        nbytes = int(np.prod(variable.shape, dtype=np.int64)) * variable.dtype.size
        device = str(getattr(variable, "device", "") or "")
        totals[device] = totals.get(device, 0) + -(-nbytes // _shards(variable))
    return totals


def bytes_per_device(variables) -> int:
    """The bytes of `variables` on the device that holds the most of them."""
    return max(bytes_by_device(variables).values(), default=0)


def optimizer_state(optimizer) -> list:
    """The optimizer's slot variables (moments, factored second moments), not its step count."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer
    counter = id(optimizer.iterations)
    return [v for v in optimizer.variables if id(v) != counter]


def measure(model, optimizer) -> dict:
    """summary.json's `memory`: the weights' and the optimizer state's bytes per device."""
    return {"weights_bytes_per_device": bytes_per_device(model.weights),
            "optimizer_bytes_per_device": bytes_per_device(optimizer_state(optimizer))}

"""Cloud TPU generations: memory per replica and what a replica is, without TensorFlow.

In `TPUStrategy` terms a replica is one TPU device. On v2 and v3 every TensorCore is its own
device (a chip has two: v2-8 and v3-8 have 8 replicas). From v4 on, the two TensorCores of a
v4/v5p chip work as one "megacore" device and v5e/v6e chips have one TensorCore, so a replica
is a chip (v4-8 has 4 replicas, v5litepod-8 has 8). Accelerator types count TensorCores for
v2, v3, v4 and v5p (`v4-8` is 4 chips) and chips for v5e and v6e (`v5litepod-8` is 8 chips).
"""
from __future__ import annotations

import dataclasses
import os
import re

from tftrain.errors import ConfigError

ACCELERATOR_ENV = "TPU_ACCELERATOR_TYPE"  # e.g. v4-8; set on GKE TPU nodes, or by hand
ASSUMED_TPU_REPLICAS = 8  # v2-8, v3-8, v5litepod-8, v6e-8; a multiple of v4-8's and v5p-8's 4


@dataclasses.dataclass(frozen=True)
class Generation:
    """One TPU generation: high-bandwidth memory of one replica, and what a replica is."""

    name: str
    hbm_gib: float  # per replica (per core on v2/v3, per chip from v4 on)
    replica: str  # "core" or "chip"
    type_counts: str  # what N in the accelerator type `<name>-N` counts: "cores" or "chips"
    cores_per_chip: int


GENERATIONS = {
    "v2": Generation("v2", 8, "core", "cores", 2),
    "v3": Generation("v3", 16, "core", "cores", 2),
    "v4": Generation("v4", 32, "chip", "cores", 2),
    "v5e": Generation("v5e", 16, "chip", "chips", 1),
    "v5p": Generation("v5p", 95, "chip", "cores", 2),
    "v6e": Generation("v6e", 32, "chip", "chips", 1),
}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e"}

# GPUs by name: memory per GPU in GiB, as NVIDIA's datasheets state it (`tftrain check
# --target=gpu --gpu_type=NAME`).
GPUS = {"a100-40gb": 40, "a100-80gb": 80, "h100-80gb": 80, "h200-141gb": 141, "l4": 24,
        "v100-16gb": 16, "v100-32gb": 32, "t4": 16}


def replica_word(tpu_type: str) -> str:
    """'core' (v2, v3), 'chip' (v4 on), or 'core' when the generation is unknown."""
    generation = GENERATIONS.get(tpu_type)
    return generation.replica if generation else "core"


def parse_accelerator_type(text: str) -> tuple[str, int]:
    """'v4-8' -> ('v4', 4 replicas); 'v5litepod-16' -> ('v5e', 16); 'v3-8' -> ('v3', 8)."""
    match = re.fullmatch(r"\s*(v\d+[a-z]*)-(\d+)\s*", text or "")
    name = _ALIASES.get(match.group(1), match.group(1)) if match else ""
    if name not in GENERATIONS:
        raise ConfigError(f"{text!r} is not a TPU accelerator type such as v2-8, v3-8, v4-8, "
                          "v5litepod-8, v5p-8 or v6e-8")
    generation, count = GENERATIONS[name], int(match.group(2))
    if generation.type_counts == "cores" and generation.replica == "chip":
        count //= generation.cores_per_chip
    return name, max(count, 1)


def tpu_from_environment() -> tuple[str, int, str]:
    """(generation, replicas, why assumed) before connecting to the TPU, without TensorFlow.

    From `TPU_ACCELERATOR_TYPE` when it is set; else 8 replicas of an unknown generation
    (a v2-8, v3-8, v5litepod-8 or v6e-8; a batch that splits over 8 also splits over the 4 of
    a v4-8 or v5p-8). The real count is checked again once the TPU is connected.
    """
    text = os.environ.get(ACCELERATOR_ENV, "")
    if text:
        name, replicas = parse_accelerator_type(text)
        return name, replicas, ""
    return "", ASSUMED_TPU_REPLICAS, (f"assumed before connecting: {ACCELERATOR_ENV}, e.g. "
                                      "v4-8, gives the real count")

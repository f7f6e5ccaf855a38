"""What each stage of the input pipeline costs, from truncated copies of the training input.

The reader's stages (`reader.STAGES`: read, parse, decode, augment) are timed as host
pipelines that stop after each one, then, when the replicas are accelerators, the whole
distributed input (what the strategy adds: per-replica batches copied to the devices; replicas
on this host's CPU have no copy to time). A stage's cost is the time per example it adds to
the pipeline that stops before it. Stages are timed without `data.cache` (what a pass that runs
them costs) and without a tf.data service (they run here). Without `data.augment` the augment
stage does nothing: its row says so rather than being timed.
"""
from __future__ import annotations

import dataclasses

from tftrain.data import reader
from tftrain.doctor import measure

TRANSFER = "transfer"
AUGMENT = "augment"
DESCRIPTIONS = {
    "read": "read records (interleaved files, shuffle, batch)",
    "parse": "parse (tf.io.parse_example)",
    "decode": "decode (the pipeline's decode)",
    AUGMENT: "augment (data.augment: crop, flip, RandAugment, erasing, mixing)",
    TRANSFER: "distribute (per-replica batches to the devices)",
}
NO_AUGMENTATION = "none: data.augment is empty"
NO_TRANSFER = "none: the replicas are this host's CPU"


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage: the rate of the pipeline that ends with it, and the time per example it adds."""

    name: str
    rate: float | None  # examples/s of the pipeline up to and including this stage
    seconds_per_example: float | None  # what this stage adds (never negative: noise is clamped)
    note: str = ""

    @property
    def description(self) -> str:
        """What the stage does, for the table."""
        return DESCRIPTIONS[self.name]


def measure_stages(backend, config, steps: int) -> list[Stage]:
    """The stages of the configured training input, in pipeline order."""
    uncached = {"cache": "none", "service_address": ""}
    examples = measure.examples_per_step(config)
    timed = [name for name in reader.STAGES if name != AUGMENT or config.data.augment]
    rates = {name: measure.input_rate(measure.host_input(config, last_stage=name, **uncached),
                                      steps, examples)
             for name in timed}
    stages, before = [], 0.0
    for name in timed:
        stages.append(Stage(name, rates[name], max(0.0, 1 / rates[name] - before)))
        before = max(before, 1 / rates[name])
    if AUGMENT not in timed:
        stages.append(Stage(AUGMENT, None, None, NO_AUGMENTATION))
    if backend.device_type == "CPU":
        return stages + [Stage(TRANSFER, None, None, NO_TRANSFER)]
    rate = measure.input_rate(backend.training_data(config, **uncached), steps, examples)
    return stages + [Stage(TRANSFER, rate, max(0.0, 1 / rate - before))]


def costliest(stages: list[Stage]) -> Stage:
    """The stage that adds the most time per example."""
    return max((s for s in stages if s.seconds_per_example is not None),
               key=lambda s: s.seconds_per_example)


def share(stage: Stage, stages: list[Stage]) -> float:
    """The stage's part of the whole input's time per example."""
    total = sum(s.seconds_per_example for s in stages if s.seconds_per_example is not None)
    return stage.seconds_per_example / total if total else 0.0


def as_json(stage: Stage, stages: list[Stage]) -> dict:
    """One stage's row of the doctor's JSON."""
    return {"name": stage.name, "description": stage.description,
            "examples_per_second": stage.rate, "seconds_per_example": stage.seconds_per_example,
            "share": share(stage, stages) if stage.seconds_per_example is not None else None,
            "note": stage.note}

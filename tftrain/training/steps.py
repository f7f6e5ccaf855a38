"""How long a run is, in optimizer updates: the one plan `train`, `check` and `doctor` share."""
from __future__ import annotations

import dataclasses
import math

from absl import logging

from tftrain import config_schema as config_lib


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How long the run is, in optimizer updates."""

    steps_per_epoch: int
    epochs: int
    total_steps: int


def plan_steps(train_config: config_lib.TrainConfig, num_examples: int,
               examples_per_step: int) -> StepPlan:
    """`train.epochs` of `steps_per_epoch` (default one pass), or `train.steps` when set.

    With `train.steps`, epochs are `steps_per_epoch` long (at most `train.steps`) and the last
    one ends at step `train.steps`; `train.epochs` is then not used.
    """
    steps_per_epoch = train_config.steps_per_epoch or max(1, num_examples // examples_per_step)
    if train_config.steps:
        steps_per_epoch = min(steps_per_epoch, train_config.steps)
        epochs = math.ceil(train_config.steps / steps_per_epoch)
        logging.info("train.steps=%d: %d epoch(s) of %d steps (train.epochs is not used)",
                     train_config.steps, epochs, steps_per_epoch)
        return StepPlan(steps_per_epoch, epochs, train_config.steps)
    return StepPlan(steps_per_epoch, train_config.epochs, train_config.epochs * steps_per_epoch)

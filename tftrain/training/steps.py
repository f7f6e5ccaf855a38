"""How long a run is, in optimizer updates: the one plan `train`, `check` and `doctor` share."""
from __future__ import annotations

import dataclasses
import math

from absl import logging

from tftrain import config_schema as config_lib


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How long the run is, in optimizer updates.

    `steps_per_epoch` and `epochs` are `fit`'s: a validation (with the best checkpoint, early
    stopping, plateau and the epoch's backup) ends each epoch. `data_epoch_steps` is an epoch as
    the learning-rate schedule counts it (`train.lr_decay_epochs`); it differs from
    `steps_per_epoch` only under `train.validation_every_steps`.
    """

    steps_per_epoch: int
    epochs: int
    total_steps: int
    data_epoch_steps: int = 0  # 0: steps_per_epoch
    # examples one update consumes (the global batch x grad_accum_steps; 0: not known)
    examples_per_step: int = dataclasses.field(default=0, compare=False)

    @property
    def schedule_epoch_steps(self) -> int:
        """The steps of one epoch for the learning-rate schedule."""
        return self.data_epoch_steps or self.steps_per_epoch


def plan_steps(train_config: config_lib.TrainConfig, num_examples: int,
               examples_per_step: int) -> StepPlan:
    """`train.epochs` of `steps_per_epoch` (default one pass), or `train.steps` when set;
    validated every `train.validation_every_steps` steps when set, else at each epoch's end.

    With `train.steps`, epochs are `steps_per_epoch` long (at most `train.steps`) and the last
    one ends at step `train.steps`; `train.epochs` is then not used. The training input repeats
    without end, so `fit`'s epochs need not be passes over the data.
    """
    steps_per_epoch = train_config.steps_per_epoch or max(1, num_examples // examples_per_step)
    if train_config.steps:
        steps_per_epoch = min(steps_per_epoch, train_config.steps)
        total = train_config.steps
        logging.info("train.steps=%d: epochs of %d steps (train.epochs is not used)",
                     total, steps_per_epoch)
    else:
        total = train_config.epochs * steps_per_epoch
    every = min(train_config.validation_every_steps or steps_per_epoch, total)
    if train_config.validation_every_steps:
        logging.info("train.validation_every_steps=%d: %d validations over %d steps", every,
                     math.ceil(total / every), total)
    return StepPlan(every, math.ceil(total / every), total,
                    steps_per_epoch if every != steps_per_epoch else 0, examples_per_step)

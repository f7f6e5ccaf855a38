"""The step plan (`tftrain.training.steps.plan_steps`): how many updates, in how many `fit`
epochs, validated how often. Pure; `make mutation` runs them."""
import logging

import pytest

from tftrain.config_schema import TrainConfig
from tftrain.training.steps import StepPlan, plan_steps


@pytest.mark.parametrize("config, examples, plan", [
    # epochs of one pass: 100 // 32 = 3 steps
    (dict(epochs=3), 100, StepPlan(3, 3, 9)),
    (dict(epochs=1), 96, StepPlan(3, 1, 3)),
    (dict(epochs=3), 10, StepPlan(1, 3, 3)),  # fewer examples than a step: one step
    (dict(epochs=3), 0, StepPlan(1, 3, 3)),
    (dict(epochs=2, steps_per_epoch=5), 100, StepPlan(5, 2, 10)),
    # train.steps: epochs of at most train.steps, the last one cut at train.steps
    (dict(epochs=99, steps=7), 100, StepPlan(3, 3, 7)),
    (dict(epochs=99, steps=6), 100, StepPlan(3, 2, 6)),
    (dict(steps=2), 100, StepPlan(2, 1, 2)),
    (dict(steps=2, steps_per_epoch=5), 100, StepPlan(2, 1, 2)),
    # validated every N steps: fit's epochs are N steps, the schedule's stay a pass
    (dict(epochs=3, validation_every_steps=4), 320, StepPlan(4, 8, 30, 10)),
    (dict(epochs=3, validation_every_steps=10), 320, StepPlan(10, 3, 30)),
    (dict(epochs=3, validation_every_steps=50), 320, StepPlan(30, 1, 30, 10)),
    (dict(steps=25, validation_every_steps=4), 320, StepPlan(4, 7, 25, 10)),
    (dict(steps=3, validation_every_steps=5), 320, StepPlan(3, 1, 3)),
])
def test_plan_steps(config, examples, plan):
    got = plan_steps(TrainConfig(**config), examples, 32)
    assert got == plan
    assert all(type(n) is int for n in (got.steps_per_epoch, got.epochs, got.total_steps,
                                        got.data_epoch_steps))
    assert got.schedule_epoch_steps == (plan.data_epoch_steps or plan.steps_per_epoch)


def messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "absl"]


def test_what_plan_steps_logs(caplog):
    caplog.set_level(logging.INFO, logger="absl")
    plan_steps(TrainConfig(epochs=3), 100, 32)
    assert messages(caplog) == []
    plan_steps(TrainConfig(steps=7), 100, 32)
    assert messages(caplog) == ["train.steps=7: epochs of 3 steps (train.epochs is not used)"]
    caplog.clear()
    plan_steps(TrainConfig(epochs=3, validation_every_steps=4), 320, 32)
    assert messages(caplog) == ["train.validation_every_steps=4: 8 validations over 30 steps"]


def test_a_plan_knows_the_examples_of_an_update_but_is_compared_without_them():
    plan = plan_steps(TrainConfig(epochs=2), 100, 32)
    assert plan.examples_per_step == 32
    assert plan == StepPlan(3, 2, 6)  # a plan is its steps: what the run resumes with
    assert StepPlan(3, 2, 6).examples_per_step == 0  # not known

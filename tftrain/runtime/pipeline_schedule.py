"""Pipeline schedules (`runtime.pipeline_schedule`): the order in which each stage runs the
forward and backward passes of a step's micro-batches, as a plain list of actions.

- `gpipe`: every stage runs all M forwards, then all M backwards; a stage holds the
  activations of all M micro-batches at once.
- `1f1b` (PipeDream-Flush, as in Megatron-LM and `torch.distributed.pipelining`): stage s
  runs min(S - s - 1, M) warm-up forwards, then alternates one forward and one backward, then
  runs the remaining backwards; it holds at most min(S - s, M) micro-batches' activations.

Both idle each device for the same share of a step, (S - 1) / (M + S - 1): 1F1B saves memory,
not time. The list is in an order that respects every data dependency (forward of micro-batch
m on stage s after stage s - 1's; backward after stage s + 1's and after its own forward), and
its subsequence for one stage is that stage's order: `pipeline_model` writes the step's graph
in this order and chains each stage's actions with control dependencies.
"""
from __future__ import annotations

import typing

from tftrain.config_schema import PIPELINE_SCHEDULES
from tftrain.errors import ConfigError

FORWARD, BACKWARD = "forward", "backward"


class Action(typing.NamedTuple):
    """One stage's forward or backward pass of one micro-batch."""

    stage: int
    microbatch: int
    kind: str  # FORWARD | BACKWARD


def check(kind: str) -> None:
    """Raises ConfigError in one line unless `kind` names a schedule."""
    if kind not in PIPELINE_SCHEDULES:
        raise ConfigError(f"runtime.pipeline_schedule={kind!r} is not one of "
                          f"{', '.join(PIPELINE_SCHEDULES)}")


def stage_order(kind: str, stages: int, microbatches: int, stage: int) -> list[Action]:
    """The actions of `stage`, in the order it runs them."""
    check(kind)
    forwards = [Action(stage, m, FORWARD) for m in range(microbatches)]
    backwards = [Action(stage, m, BACKWARD) for m in range(microbatches)]
    if kind == "gpipe":
        return forwards + backwards
    warmup = min(stages - stage - 1, microbatches)
    order = forwards[:warmup]
    for m in range(microbatches - warmup):  # steady state: one forward, one backward
        order += [forwards[warmup + m], backwards[m]]
    return order + backwards[microbatches - warmup:]


def _depends_on(action: Action, stages: int) -> Action | None:
    """The other stage's action that `action` waits for (its own stage's order aside)."""
    if action.kind == FORWARD:
        return Action(action.stage - 1, action.microbatch, FORWARD) if action.stage else None
    if action.stage == stages - 1:
        return None  # the last stage's backward starts from its own forward's loss
    return Action(action.stage + 1, action.microbatch, BACKWARD)


def schedule(kind: str, stages: int, microbatches: int) -> list[Action]:
    """Every stage's actions of one step, merged into one list in clock ticks: at each tick,
    each stage runs its next action if what it waits for ran at an earlier tick."""
    pending = [stage_order(kind, stages, microbatches, s) for s in range(stages)]
    done: set[Action] = set()
    merged: list[Action] = []
    while any(pending):
        tick = [order[0] for order in pending
                if order and _depends_on(order[0], stages) in done | {None}]
        if not tick:
            raise AssertionError(f"{kind} schedule deadlocks: {[o[:1] for o in pending]}")
        for action in tick:
            pending[action.stage].pop(0)
        done.update(tick)
        merged += tick
    return merged


def max_in_flight(actions: list[Action], stages: int) -> list[int]:
    """Per stage, the most micro-batches whose forward has run and whose backward has not, at
    any point of `actions`: whose activations the stage holds at once."""
    held, most = [0] * stages, [0] * stages
    for action in actions:
        held[action.stage] += 1 if action.kind == FORWARD else -1
        most[action.stage] = max(most[action.stage], held[action.stage])
    return most


def bubble_fraction(kind: str, stages: int, microbatches: int) -> float:
    """The share of a step each device idles, the same for both schedules: (S-1)/(M+S-1)."""
    check(kind)
    return (stages - 1) / (microbatches + stages - 1)

"""Pipeline schedules (`runtime.pipeline_schedule`): the order in which each stage runs the
forward and backward passes of a step's micro-batches, as a plain list of actions.

- `gpipe`: every stage runs all M forwards, then all M backwards; a stage holds the
  activations of all M micro-batches at once.
- `1f1b` (PipeDream-Flush, as in Megatron-LM and `torch.distributed.pipelining`): stage s
  runs min(S - s - 1, M) warm-up forwards, then alternates one forward and one backward, then
  runs the remaining backwards; it holds at most min(S - s, M) micro-batches' activations.
- `interleaved` (Megatron-LM's virtual pipeline stages, Narayanan et al. 2021; `torch`'s
  `ScheduleInterleaved1F1B`): the model is cut into S x V chunks and chunk c runs on stage
  (device) c % S, so each stage holds V chunks, its chunk v being the model's chunk v * S + s.
  Stage s runs its M x V passes of each kind in groups of S micro-batches per chunk (forwards:
  chunk 0 on micro-batches 0..S-1, chunk 1 on the same, ..., then the next S micro-batches;
  backwards the same with the chunks reversed): min(2 (S - s - 1) + (V - 1) S, M V) warm-up
  forwards, then one forward one backward, then the remaining backwards. M must be a multiple
  of S.

gpipe and 1f1b idle each device for the same share of a step, (S - 1) / (M + S - 1): 1F1B
saves memory, not time; interleaved idles it for (S - 1) / (V M + S - 1), at the price of V
times as many sends between stages. The list is in an order that respects every data
dependency (forward of micro-batch m on chunk c after chunk c - 1's; backward after chunk
c + 1's and after its own forward), and its subsequence for one stage is that stage's order:
`pipeline_model` writes the step's graph in this order and chains each stage's actions (all
its chunks' together) with control dependencies.
"""
from __future__ import annotations

import typing

from tftrain.config_schema import PIPELINE_SCHEDULES
from tftrain.errors import ConfigError

FORWARD, BACKWARD = "forward", "backward"
INTERLEAVED = "interleaved"


class Action(typing.NamedTuple):
    """One stage's forward or backward pass of one micro-batch, on the stage's chunk
    `virtual` (always 0 but under `interleaved`)."""

    stage: int  # the device's place in the pipeline, 0 .. S - 1
    microbatch: int
    kind: str  # FORWARD | BACKWARD
    virtual: int = 0  # which of the stage's V chunks

    def chunk(self, stages: int) -> int:
        """The model's chunk this action runs (of S x V, in model order)."""
        return self.virtual * stages + self.stage


def check(kind: str, stages: int = 0, microbatches: int = 0, virtual: int = 1) -> None:
    """Raises ConfigError in one line unless `kind` names a schedule that runs `virtual`
    chunks per stage (and, given `stages`, `microbatches` that it can split into groups)."""
    if kind not in PIPELINE_SCHEDULES:
        raise ConfigError(f"runtime.pipeline_schedule={kind!r} is not one of "
                          f"{', '.join(PIPELINE_SCHEDULES)}")
    if kind == INTERLEAVED and virtual < 2:
        raise ConfigError(f"runtime.pipeline_schedule=interleaved needs runtime.virtual_stages "
                          f">= 2 (the chunks each stage holds), got {virtual}")
    if kind != INTERLEAVED and virtual != 1:
        raise ConfigError(f"runtime.virtual_stages={virtual} needs runtime.pipeline_schedule="
                          f"interleaved ({kind} runs one chunk per stage): set it to 1")
    if kind == INTERLEAVED and stages and microbatches % stages:
        fixed = -(-microbatches // stages) * stages
        raise ConfigError(f"runtime.pipeline_schedule=interleaved runs micro-batches in groups "
                          f"of runtime.pipeline_stages={stages}, and runtime.microbatches="
                          f"{microbatches} is not a multiple of it: use runtime.microbatches="
                          f"{fixed}")


def _interleaved_order(stages: int, microbatches: int, stage: int,
                       virtual: int) -> list[Action]:
    """Stage `stage`'s actions under `interleaved` (Megatron-LM's
    `forward_backward_pipelining_with_interleaving`: the k-th forward runs chunk
    (k mod S V) // S on micro-batch (k // S V) S + k mod S; the k-th backward the same chunk
    counted from the last)."""
    group = stages * virtual

    def nth(k: int, kind: str) -> Action:
        v = (k % group) // stages
        return Action(stage, (k // group) * stages + k % stages, kind,
                      v if kind == FORWARD else virtual - 1 - v)

    total = microbatches * virtual
    warmup = min(2 * (stages - stage - 1) + (virtual - 1) * stages, total)
    order = [nth(k, FORWARD) for k in range(warmup)]
    for k in range(total - warmup):  # steady state: one forward, one backward
        order += [nth(warmup + k, FORWARD), nth(k, BACKWARD)]
    return order + [nth(k, BACKWARD) for k in range(total - warmup, total)]


def stage_order(kind: str, stages: int, microbatches: int, stage: int,
                virtual: int = 1) -> list[Action]:
    """The actions of `stage` (all its chunks'), in the order it runs them."""
    check(kind, stages, microbatches, virtual)
    if kind == INTERLEAVED:
        return _interleaved_order(stages, microbatches, stage, virtual)
    forwards = [Action(stage, m, FORWARD) for m in range(microbatches)]
    backwards = [Action(stage, m, BACKWARD) for m in range(microbatches)]
    if kind == "gpipe":
        return forwards + backwards
    warmup = min(stages - stage - 1, microbatches)
    order = forwards[:warmup]
    for m in range(microbatches - warmup):  # steady state: one forward, one backward
        order += [forwards[warmup + m], backwards[m]]
    return order + backwards[microbatches - warmup:]


def at_chunk(chunk: int, microbatch: int, kind: str, stages: int) -> Action:
    """The action of the model's chunk `chunk` (on stage chunk % S)."""
    return Action(chunk % stages, microbatch, kind, chunk // stages)


def _depends_on(action: Action, stages: int, virtual: int) -> Action | None:
    """The other chunk's action that `action` waits for (its own stage's order aside)."""
    chunk = action.chunk(stages)
    if action.kind == FORWARD:
        return at_chunk(chunk - 1, action.microbatch, FORWARD, stages) if chunk else None
    if chunk == stages * virtual - 1:
        return None  # the last chunk's backward starts from its own forward's loss
    return at_chunk(chunk + 1, action.microbatch, BACKWARD, stages)


def schedule(kind: str, stages: int, microbatches: int, virtual: int = 1) -> list[Action]:
    """Every stage's actions of one step, merged into one list in clock ticks: at each tick,
    each stage runs its next action if what it waits for ran at an earlier tick."""
    pending = [stage_order(kind, stages, microbatches, s, virtual) for s in range(stages)]
    done: set[Action] = set()
    merged: list[Action] = []
    while any(pending):
        tick = [order[0] for order in pending
                if order and _depends_on(order[0], stages, virtual) in done | {None}]
        if not tick:
            raise AssertionError(f"{kind} schedule deadlocks: {[o[:1] for o in pending]}")
        for action in tick:
            pending[action.stage].pop(0)
        done.update(tick)
        merged += tick
    return merged


def peak_held(actions: list[Action], stages: int,
              size: typing.Callable[[Action], float]) -> list[float]:
    """Per stage (device), the most that the passes whose forward has run and whose backward
    has not add up to, at any point of `actions`, each counting `size(its forward)`."""
    held, most = [0.0] * stages, [0.0] * stages
    for action in actions:
        forward = action._replace(kind=FORWARD)
        held[action.stage] += size(forward) if action.kind == FORWARD else -size(forward)
        most[action.stage] = max(most[action.stage], held[action.stage])
    return most


def max_in_flight(actions: list[Action], stages: int) -> list[int]:
    """Per stage (device), the most micro-batches whose forward has run and whose backward has
    not, at any point of `actions`: whose activations the stage holds at once (under
    `interleaved`, a micro-batch in flight on two of its chunks counts twice)."""
    return [int(most) for most in peak_held(actions, stages, lambda action: 1)]


def bubble_fraction(kind: str, stages: int, microbatches: int, virtual: int = 1) -> float:
    """The share of a step each device idles: (S-1)/(M+S-1) under gpipe and 1f1b, (S-1)/(V M +
    S-1) under interleaved (each pass 1/V as long)."""
    check(kind, virtual=virtual)
    return (stages - 1) / (virtual * microbatches + stages - 1)

"""Freeze-then-unfreeze as data: a builder says which layers start training at which epoch.

`application` with `unfreeze_at_epoch` records an `UnfreezeSchedule` for the model it built
(`schedule`); the engine asks for it (`schedule_of`) and trains it with the
`tftrain.callbacks.unfreeze.Unfreeze` callback. The record is kept beside the model, not on it,
so it is never saved with the model.
"""
from __future__ import annotations

import dataclasses
import weakref

_SCHEDULES = weakref.WeakKeyDictionary()  # model -> its UnfreezeSchedule


@dataclasses.dataclass(frozen=True)
class UnfreezeSchedule:
    """`layers` (built frozen) start training at the 0-based epoch `at_epoch`, with the learning
    rate multiplied by `lr_factor` from then on."""

    layers: tuple
    at_epoch: int
    lr_factor: float


def schedule(model, unfreeze: UnfreezeSchedule) -> None:
    """Records that `model` trains with `unfreeze`."""
    _SCHEDULES[model] = unfreeze


def schedule_of(model) -> UnfreezeSchedule | None:
    """The schedule `model`'s builder recorded, or None (most models)."""
    return _SCHEDULES.get(model)

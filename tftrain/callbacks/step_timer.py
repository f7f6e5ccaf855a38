"""Steady-state speed: seconds per step and examples per second, without the first epoch.

The first epoch of each attempt (the first run, and each resume) pays for tracing and warming
the input pipeline; it is left out of the averages when other epochs were timed. Validation
time is not counted. The totals of earlier attempts come back with the backup (`get_state`,
see `callback_state`), so a resumed run reports the speed of the whole run.
"""
from __future__ import annotations

import time

import tf_keras as keras


class StepTimer(keras.callbacks.Callback):
    """Times the training steps of each epoch (from epoch begin to its last step)."""

    def __init__(self, examples_per_step: int):
        super().__init__()
        self._supports_tf_logs = True
        self.examples_per_step = examples_per_step
        self.epochs: list[tuple[int, float]] = []  # (steps, seconds) of each epoch of this attempt
        self._earlier = {"cold_steps": 0.0, "cold_seconds": 0.0,  # earlier attempts' totals
                         "warm_steps": 0.0, "warm_seconds": 0.0}
        self._started = None
        self._steps = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._started, self._steps, self._first_step = time.perf_counter(), 0, None

    def on_train_batch_begin(self, batch, logs=None):
        if self._first_step is None:
            self._first_step = batch

    def on_train_batch_end(self, batch, logs=None):
        self._steps = batch - (self._first_step or 0) + 1
        self._ended = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if self._steps:
            self.epochs.append((self._steps, self._ended - self._started))

    def get_state(self) -> dict:
        """Steps and seconds of the first epochs of the attempts ("cold") and of the others."""
        state = dict(self._earlier)
        for index, (steps, seconds) in enumerate(self.epochs):
            kind = "cold" if index == 0 else "warm"
            state[f"{kind}_steps"] += steps
            state[f"{kind}_seconds"] += seconds
        return state

    def set_state(self, state: dict) -> None:
        """Takes the totals of the earlier attempts (from `get_state` of a backup)."""
        self._earlier = {key: float(state[key]) for key in self._earlier}
        self.epochs = []

    @property
    def timed(self) -> bool:
        """Whether any epoch of the run (this attempt or an earlier one) was timed."""
        return bool(self.epochs) or self._earlier["cold_steps"] > 0

    def seconds_per_step(self) -> float:
        """The mean step time over the epochs after each attempt's first (all if none)."""
        state = self.get_state()
        kind = "warm" if state["warm_steps"] else "cold"
        steps = state[f"{kind}_steps"]
        return state[f"{kind}_seconds"] / steps if steps else float("nan")

    def examples_per_second(self) -> float:
        """Training throughput in examples (over all replicas) per second."""
        return self.examples_per_step / self.seconds_per_step()

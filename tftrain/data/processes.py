"""Worker processes for the converter: a forkserver that has imported TensorFlow once.

TensorFlow is not fork-safe once it runs, so workers never fork from the converting process.
They fork from a forkserver: a clean process that has only *imported* TensorFlow (no op has
run), so each worker starts in milliseconds instead of importing TensorFlow again. `warm_up()`
starts it early (the CLI calls it first thing), so its import overlaps the caller's own.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os

from tftrain import forked

PRELOAD = ["tftrain.data.worker_preload"]
# A source of at most this many rows is written by one process (`shard_plan` samples this many).
SMALL_SOURCE_ROWS = 4096


def needs_workers(pipeline, source: str, workers: int | None) -> bool:
    """True when a conversion will surely run worker processes, so their forkserver may start
    before the plan is made (its TensorFlow import then overlaps the sample): `workers` asked
    for, or a source known to be larger than a sample. A source of unknown size gets its server
    only once the plan gives it more than one worker (`shard_plan.choose` gives a small one,
    read whole by its sample, one worker): started for nothing, its TensorFlow import would cost
    a core for seconds.
    """
    if workers == 1:
        return False
    rows = pipeline.known_num_rows(source)
    return (workers or 0) > 1 or (rows is not None and rows > SMALL_SOURCE_ROWS)


def context():
    """The multiprocessing context the converter's workers run in."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


_started_here = False  # whether this process started the forkserver (`warm_up`)


def warm_up() -> None:
    """Starts the forkserver now (non-blocking: it imports TensorFlow in the background)."""
    global _started_here
    try:
        _started_here = forked.start_server(PRELOAD) or _started_here
    except (OSError, ValueError):
        pass  # the writer starts it (or reports why it cannot) when it needs workers


@contextlib.contextmanager
def server(needed: bool):
    """The forkserver, started now when `needed` and stopped at the end when this process
    started it (here or in `warm_up`): idle, it would hold TensorFlow's memory for as long as
    the process lives, through a whole `train` that converted its data on first use."""
    global _started_here
    if needed:
        warm_up()
    try:
        yield
    finally:
        if _started_here:
            _started_here = False
            forked.stop_server()


def pid_alive(pid: int) -> bool:
    """True while process `pid` exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

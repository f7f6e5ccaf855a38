"""The doctor's measurements: the inputs it times and how it times them.

Every input is built by `tftrain.data.reader` with the keyword arguments `tftrain train` uses
(`training_kwargs`), so a measurement times the pipeline a run reads. A rate is in examples
per second over all replicas, after a warm-up that absorbs tracing, the first fill of the
shuffle buffer, tf.data's autotuning and (for a cached pipeline) the pass that fills the cache.
"""
from __future__ import annotations

import dataclasses
import math
import time

import tensorflow as tf
from absl import logging

from tftrain.callbacks.step_timer import StepTimer
from tftrain.data import foreign, reader
from tftrain.engine import backends

TIMED_EPOCHS = 6  # fit: one warm-up epoch, then this many timed epochs (steps / TIMED_EPOCHS each)
REPLAY_BYTES = 256 << 20  # at most this much of decoded batches is replayed from memory
REPLAY_BATCHES = 8
ROUNDS = 2  # each way is timed this many times (interleaved with the others): the best counts


def examples_per_step(config) -> int:
    """Examples one optimizer update consumes: the global batch times `grad_accum_steps`."""
    return config.data.batch_size * config.train.grad_accum_steps


def training_kwargs(config, **changes) -> dict:
    """`backends.training_input_kwargs` with `changes` (e.g. `cache="decoded"`) applied."""
    return {**backends.training_input_kwargs(config), **changes}


def host_input(config, **changes) -> tf.data.Dataset:
    """The training input as one host pipeline of global batches, no strategy (with `changes`,
    e.g. `last_stage="parse"`)."""
    return reader.load(config.data.dir, config.data.train_split, examples_per_step(config),
                       **training_kwargs(config, **changes))


def replay_batches(config) -> int:
    """How many real training batches the model alone is timed on (read once, then replayed
    from memory by the backend, so its steps wait on no reading or decoding)."""
    return max(1, min(REPLAY_BATCHES, REPLAY_BYTES // max(1, batch_bytes(config))))


def batch_bytes(config) -> int:
    """Bytes of one decoded training batch, from the pipeline's element spec (0 if unknown)."""
    return examples_per_step(config) * example_bytes(config)


def example_bytes(config) -> int:
    """Bytes of one decoded training example (0 when its shape is not fixed)."""
    spec = reader.load(config.data.dir, config.data.train_split, 1, training=False,
                       **foreign.load_kwargs(config.data)).element_spec
    total = 0
    for tensor in tf.nest.flatten(spec):
        shape = tensor.shape[1:]
        if not shape.is_fully_defined():
            return 0
        total += shape.num_elements() * tensor.dtype.size
    return total


def steps_per_pass(config, num_examples: int) -> int:
    """Training steps in one pass over `num_examples` examples (at least 1)."""
    return max(1, math.ceil(num_examples / examples_per_step(config)))


def input_rate(dataset, steps: int, examples_per_batch: int, warmup: int = 0) -> float:
    """Examples/s of iterating `dataset` (batches of `examples_per_batch`) for `steps` batches,
    after `warmup` batches; the input alone, nothing consumes it."""
    began = time.perf_counter()
    iterator = iter(dataset)
    for _ in range(warmup_steps(steps) + warmup):
        next(iterator)
    started = time.perf_counter()
    for _ in range(steps):
        next(iterator)
    ended = time.perf_counter()
    logging.info("input: %d batches in %.2fs after a %.2fs warm-up", steps, ended - started,
                 started - began)
    return steps * examples_per_batch / (ended - started)


def fit_rate(trainer, dataset, steps: int, examples: int, execution: int) -> float:
    """Examples/s of `trainer.fit` on `dataset` over about `steps` steps, after a warm-up epoch.

    The same `fit` and train function as a run (compiled with `execution` steps per call), with
    no callback but `StepTimer`, which leaves the warm-up epoch out.
    """
    per_epoch = execution * max(1, round(steps / TIMED_EPOCHS / execution))
    timer = StepTimer(examples)
    began = time.perf_counter()
    trainer.fit(dataset, epochs=1 + TIMED_EPOCHS, steps_per_epoch=per_epoch, verbose=0,
                callbacks=[timer])
    logging.info("fit: %d epochs of %d steps in %.2fs, %.2fs of them timed", 1 + TIMED_EPOCHS,
                 per_epoch, time.perf_counter() - began, sum(t for _, t in timer.epochs[1:]))
    return timer.examples_per_second()


def warmup_steps(steps: int) -> int:
    """Batches read before timing `steps` of an input: tracing, buffers, autotuning."""
    return max(10, steps // TIMED_EPOCHS)


def three_ways(input_alone, model_alone, combined) -> Rates:
    """The best of ROUNDS interleaved rounds of each way (`input_alone(round_index)`, so its
    first round can warm up a cache; `model_alone()`, `combined()`): the machine may be shared."""
    rates = [0.0, 0.0, 0.0]
    for round_index in range(ROUNDS):
        rates[0] = max(rates[0], input_alone(round_index))
        rates[1] = max(rates[1], model_alone())
        rates[2] = max(rates[2], combined())
    return Rates(*rates)


def best(measure_once, rounds: int = ROUNDS) -> float:
    """The highest of `rounds` calls of `measure_once()` (a rate): the least disturbed one."""
    return max(measure_once() for _ in range(rounds))


@dataclasses.dataclass(frozen=True)
class Rates:
    """The three ways of running the configured training, in examples/s over all replicas."""

    input_alone: float
    model_alone: float
    combined: float

    @property
    def input_wait(self) -> float:
        """The share of a training step spent waiting on input: 1 - combined / model alone."""
        return min(1.0, max(0.0, 1.0 - self.combined / self.model_alone))

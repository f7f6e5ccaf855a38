"""The verdict (input-bound or compute-bound) and the changes that would help, tried if they can.

Input-bound means the model alone trains at least INPUT_BOUND_MARGIN times faster than the
input alone delivers examples: the model would wait on the input by a clear margin. Otherwise
the run is compute-bound. A change the doctor can make in this process (an in-memory cache,
tf.data's autotuning off, more steps per execution) is tried, and suggested only when it measured at least HELPS times faster.
Changes it cannot try here (reconverting, other machines) are advice text, chosen from the
costliest input stage.
"""
from __future__ import annotations

import dataclasses

from absl import logging

from tftrain.doctor import measure, stages as stages_lib

INPUT_BOUND, COMPUTE_BOUND = "input-bound", "compute-bound"
INPUT_BOUND_MARGIN = 1.25
HELPS = 1.1  # a tried change is suggested when it is at least this much faster
TRIAL_SECONDS = 60.0  # a cache is tried only when filling it (one pass) takes at most this long
MEMORY_SHARE = 0.5  # ... and when it needs at most this share of the free memory
SMALL_STEP_SECONDS = 0.01  # steps_per_execution is tried for steps shorter than this
STEPS_PER_EXECUTION = 8
PARALLEL_FILES = 16  # the reader reads up to this many shard files at once
MAX_SUGGESTIONS = 2


@dataclasses.dataclass(frozen=True)
class Suggestion:
    """One change: the config override (or command) that makes it, why, and what it measured."""

    change: str  # e.g. "data.cache=decoded", or a command for what no config key does
    why: str
    speedup: float | None = None  # measured: new rate / old rate of `measured`; None: not tried
    measured: str = ""  # which rate the speed-up is of: "input alone", "model alone"
    for_input: bool = True

    def line(self) -> str:
        """The advice line: the change, its measured speed-up (or 'not measured here'), why."""
        found = (f"{self.measured} {self.speedup:.2f}x faster (measured)" if self.speedup
                 else "not measured here")
        return f"{self.change}: {found}; {self.why}"


@dataclasses.dataclass(frozen=True)
class Trial:
    """A change the doctor tried: what it measured against what it had."""

    change: str
    measured: str
    before: float
    after: float

    @property
    def speedup(self) -> float:
        return self.after / self.before


def verdict(rates: measure.Rates) -> str:
    """INPUT_BOUND when the model alone is at least INPUT_BOUND_MARGIN x the input alone."""
    if rates.model_alone >= INPUT_BOUND_MARGIN * rates.input_alone:
        return INPUT_BOUND
    return COMPUTE_BOUND


def choose(tried: list[Trial], text: list[Suggestion], whys: dict) -> list[Suggestion]:
    """At most MAX_SUGGESTIONS: the tried changes that helped (fastest first), then advice text."""
    helped = sorted((t for t in tried if t.speedup >= HELPS), key=lambda t: -t.speedup)
    chosen = [Suggestion(t.change, whys[t.change], t.speedup, t.measured,
                         t.change.startswith("data.")) for t in helped]
    return (chosen + text)[:MAX_SUGGESTIONS]


def try_cache(backend, config, manifest: dict, rates: measure.Rates, steps: int,
              ) -> tuple[list[Trial], list[Suggestion], dict]:
    """Tries the in-memory caches the configured input does not use yet, when they fit.

    Returns the trials, advice for a cache that cannot be tried here, and why each change helps.
    """
    from tftrain.host import available_memory
    from tftrain.errors import DataError

    split = manifest.splits[config.data.train_split]
    examples = split.num_examples
    fill_seconds = examples / rates.input_alone
    free = available_memory()
    candidates = {"decoded": ("no reading, parsing or decoding after the first epoch",
                              examples * measure.example_bytes(config)),
                  "records": ("no file reads after the first epoch",
                              split.bytes)}
    order = {"none": ["decoded", "records"], "records": ["decoded"]}.get(config.data.cache, [])
    tried, text, whys = [], [], {}
    for mode in order:
        change = f"data.cache={mode}"
        why, size = candidates[mode]
        if not size:
            continue  # decoded examples of varying shape, or shard sizes unknown
        if free is not None and size > MEMORY_SHARE * free:
            text.append(Suggestion(change, f"{why}, but it needs ~{size / 2**30:.1f} GiB, more "
                                   f"than {MEMORY_SHARE:.0%} of this machine's free memory"))
            continue
        whys[change] = f"{why} (~{size / 2**20:.0f} MiB in memory)"
        if fill_seconds > TRIAL_SECONDS:
            text.append(Suggestion(change, f"{whys[change]}; not tried: filling it takes one pass "
                                   f"(~{fill_seconds:.0f} s here)"))
            continue
        try:
            dataset = backend.training_data(config, cache=mode)
        except DataError as e:
            logging.info("%s not tried: %s", change, e)
            continue
        fill = [measure.steps_per_pass(config, examples)]  # the first round fills the cache
        rate = measure.best(lambda: measure.input_rate(
            dataset, steps, measure.examples_per_step(config), warmup=fill.pop() if fill else 0))
        tried.append(Trial(change, "input alone", rates.input_alone, rate))
        if rate >= HELPS * rates.input_alone:
            break  # the best cache that fits helps: the smaller one would help less
    return tried, text, whys


AUTOTUNE_OFF = "data.autotune=false"
AUTOTUNE_WHY = ("tf.data's autotuning off: every parallel read and map runs one call per core "
                "from the start (on small hosts autotuning can leave a core idle)")


def try_autotune_off(backend, config, rates: measure.Rates, steps: int,
                     fill_steps: int) -> list[Trial]:
    """Tries the configured input with tf.data's autotuning off (when it is on); its first
    round warms up `fill_steps` (the pass that fills a cache)."""
    if not config.data.autotune:
        return []
    dataset = backend.training_data(config, autotune=False)
    fill = [fill_steps]
    rate = measure.best(lambda: measure.input_rate(
        dataset, steps, measure.examples_per_step(config), warmup=fill.pop() if fill else 0))
    return [Trial(AUTOTUNE_OFF, "input alone", rates.input_alone, rate)]


def input_text(config, manifest, stages: list[stages_lib.Stage]) -> list[Suggestion]:
    """Advice for the costliest input stage that the doctor cannot try in this process."""
    worst = stages_lib.costliest(stages)
    part = f"{worst.name} is {stages_lib.share(worst, stages):.0%} of the input's time"
    files = len(manifest.splits[config.data.train_split].shards)
    text = []
    if worst.name == "read" and files and files < PARALLEL_FILES:
        text.append(Suggestion(
            f"more shards (tftrain convert --num_shards={PARALLEL_FILES})",
            f"{part}, and the {files} shard file(s) of split {config.data.train_split!r} are all "
            f"the reader can read in parallel (up to {PARALLEL_FILES})"))
    if worst.name == "decode" and "image/encoded" in manifest.features:
        text.append(Suggestion(
            "image_encoding=raw (when converting)",
            f"{part}: images stored as raw pixels are not decoded at all"))
    if worst.name == "augment":
        text.append(Suggestion(
            "a lighter data.augment",
            f"{part}: randaugment (fewer num_layers) and random_erasing run image by image"))
    if worst.name in ("parse", "decode", "read", "augment"):
        where = ("more workers for the tf.data service at data.service_address"
                 if config.data.service_address else "data.service_address=HOST:PORT")
        text.append(Suggestion(where, f"{part}: a tf.data service runs the input on other "
                               "machines' CPUs (tftrain data_service)"))
    return text


def try_steps_per_execution(config, rates: measure.Rates, run_model) -> list[Trial]:
    """Tries STEPS_PER_EXECUTION steps per call for a short step (per-step overhead matters).

    `run_model(config)` returns the model-alone rate of a model built from `config`.
    """
    step_seconds = measure.examples_per_step(config) / rates.model_alone
    if config.train.steps_per_execution != 1 or step_seconds >= SMALL_STEP_SECONDS:
        return []
    changed = dataclasses.replace(config, train=dataclasses.replace(
        config.train, steps_per_execution=STEPS_PER_EXECUTION))
    return [Trial(f"train.steps_per_execution={STEPS_PER_EXECUTION}", "model alone",
                  rates.model_alone, run_model(changed))]


SPE_WHY = (f"{STEPS_PER_EXECUTION} steps per tf.function call: less per-step overhead for a "
           "short step")


def suggestion_json(suggestion: Suggestion) -> dict:
    """One suggestion's entry of the doctor's JSON."""
    return {"change": suggestion.change, "why": suggestion.why, "speedup": suggestion.speedup,
            "measured": suggestion.measured, "for_input": suggestion.for_input,
            "line": suggestion.line()}

"""`tftrain check`: a dry run of a config for a target, before paying for the hardware.

Everything that can be known without the hardware, in one report of one-line findings: the
rules of `tftrain.rules` (storage, precision, the batch split, the input pipeline's graph),
then the memory plan (`memory`: one device's bytes by part for the config's backend, from the
model's shapes built in a graph, against the target device's memory, with the changes that
would fit when it does not), then the run built as `train` builds it (`engine.prepare`) on this
machine's default strategy under the target's policy, its real train and eval steps compiled by
XLA and run on one real batch (`xla`), when its state fits half this machine's free memory.
`Report.to_json` (`--json`) holds the findings and the plan. It all runs here, on the CPU:
nothing connects to a TPU or needs one. What `train` checks before connecting to a TPU is
`tftrain.rules.before_connecting`, which runs this whole check in a child process
(`isolated.main`). This module does not import TensorFlow at import time.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging as python_logging

from absl import logging

from tftrain.host import available_memory
from tftrain.rules import bad_input, batch, failure, input_pipeline, precision, read_manifest
from tftrain.rules import storage
from tftrain.rules.report import ADVICE, Finding, Report, Target

HOST_SHARE = 0.5  # run the step here only on a batch whose estimate fits this share of free RAM


def run(config, target: Target, model_dir: str | None = None,
        convert_data: bool = True, gpu_type: str = "") -> Report:
    """Every check of `config` on `target`; the report (its `exit_code` is 1 on errors).

    `convert_data` is `train`'s (`config.conversion_allowed`): whether a missing dataset
    would be converted.

    The data checks need the converted dataset: the check reads it but never converts (a dry
    run writes nothing). Without it, they are skipped with a line that says so, and the input
    pipeline is checked from its source instead.
    """
    report = Report(target)
    report.extend(storage.check(config, target, model_dir, convert_data))
    report.extend(precision.check(config, target))
    manifest = read_manifest(config, report, convert_data)
    report.extend(batch.check(config, target, manifest))
    if manifest is None:
        report.extend(input_pipeline.check_source(config, target))
        return report
    try:
        report.extend(input_pipeline.check(config, target))
    except bad_input() as e:
        report.extend([failure("input", "building the training input pipeline", e)])
    report.extend(_model_checks(config, target, report, gpu_type))
    return report


def _model_checks(config, target: Target, report: Report, gpu_type: str = "") -> list[Finding]:
    """The memory plan (from the model's shapes, built in a graph), then the run built as
    `train` builds it (`engine.prepare`) on this machine's default strategy under the
    target's policy and compiler, and its steps run, when its state fits here."""
    import tensorflow as tf
    import tf_keras as keras

    from tftrain.check import memory, xla
    from tftrain.engine import backends, prepare

    from tftrain import tasks

    manifest = prepare.ensure_dataset(config.data, True, convert=False)
    config, task = tasks.resolve(config, manifest)  # model.name=auto: the data's model
    policy = precision.policy_for(config, target)
    compiled, how = xla.uses_xla(config, target)
    try:
        shapes = _shapes(config, manifest, task)
        found = memory.plan(shapes, config, target, policy, gpu_type)
    except bad_input() as e:  # a model that does not build, layout rules that do not fit it
        return [failure("model", f"building model.name={config.model.name}", e)]
    if found.device_bytes and found.bytes_per_device > memory.TIGHT * found.device_bytes:
        found.suggestions = memory.suggest(shapes, config, target, policy, found, gpu_type)
    report.memory = found.to_json()
    findings = [memory.check(found, shapes)]
    here = memory.plan(shapes, _on_this_host(config), Target("cpu", 1), policy)
    size = _host_batch(here)
    if size == 0:
        state = here.bytes_per_device - here.parts["activations"]
        return findings + [Finding(ADVICE, "xla", "steps not run: the weights and optimizer "
                                   f"state (~{memory.size(state)}) do not fit in this "
                                   "machine's free memory", "run the check on a larger "
                                   "machine to compile the steps")]
    # One step per call: train_on_batch feeds one batch, and XLA compiles the same step function
    # whatever steps_per_execution is (it only loops over it).
    one_step = dataclasses.replace(config, train=dataclasses.replace(config.train,
                                                                     steps_per_execution=1))
    previous = keras.mixed_precision.global_policy().name
    try:
        with _hiding_device_warning():
            backend = backends.StrategyBackend(one_step, tf.distribute.get_strategy(),
                                               policy=policy, jit_compile=compiled)
            try:
                run_ = prepare.prepare(one_step, backend, convert_data=False)
            except bad_input() as e:
                return [failure("model", f"building model.name={config.model.name}", e)]
        train_batch, eval_batch = _one_batch(config, target, size)
        if size < here.micro_batch:
            findings.append(Finding(ADVICE, "xla", f"steps run on {size} examples instead of "
                                    f"one replica's {here.micro_batch}, to fit this machine's "
                                    "free memory (the same ops compile; only the sizes differ)"))
        return findings + xla.check(run_.trainer, run_.model, train_batch, eval_batch, how, policy)
    finally:
        keras.mixed_precision.set_global_policy(previous)


def _shapes(config, manifest: dict, task):
    """The model's shapes for the plan, built in a graph as `train` would build it (`config`
    resolved on the dataset of `manifest`, whose task is `task`)."""
    from tftrain import models
    from tftrain.check import memory
    from tftrain.engine import backends

    input_shape = backends.input_shape(config.data)
    return memory.shapes_of(config, lambda params: models.build_model(
        config.model.name, params, input_shape, task.outputs(),
        dataset_info=manifest.get("info")))


def _on_this_host(config):
    """`config` as the check runs its steps here: one device, no mesh."""
    runtime = dataclasses.replace(config.runtime, strategy="auto", shard_optimizer_state=False)
    return dataclasses.replace(config, runtime=runtime)


class _DeviceWarningFilter(python_logging.Filter):
    """Drops Keras's "Mixed precision compatibility check (mixed_float16): WARNING" record."""

    def filter(self, record: python_logging.LogRecord) -> bool:
        return not record.getMessage().startswith(DEVICE_WARNING)


DEVICE_WARNING = "Mixed precision compatibility check"


@contextlib.contextmanager
def _hiding_device_warning():
    """Hides, at the default verbosity, Keras's warning that this machine has no GPU for
    mixed_float16 (three lines, logged once when the policy is set): the check runs the steps on
    this CPU on purpose, and the warning is about this machine, not the target. With `-v 1`
    (no `log_filter.QuietFilter` on absl's handler) it shows as everywhere else."""
    from tftrain import log_filter

    handler = logging.get_absl_handler()
    if not any(isinstance(f, log_filter.QuietFilter) for f in handler.filters):
        yield
        return
    hide = _DeviceWarningFilter()
    handler.addFilter(hide)
    try:
        yield
    finally:
        handler.removeFilter(hide)


def _host_batch(here) -> int:
    """One replica's batch, reduced to fit HOST_SHARE of this machine's free memory (0: none);
    `here` is the plan of the run on this host (one device)."""
    free = available_memory()
    if free is None:
        return here.micro_batch
    state = here.bytes_per_device - here.parts["activations"]
    budget = HOST_SHARE * free - state
    if budget <= 0:
        return 0
    per_example = max(here.parts["activations"] // max(here.micro_batch, 1), 1)
    return max(1, min(here.micro_batch, int(budget // per_example)))


def _one_batch(config, target: Target, size: int):
    """One real training batch (size x grad_accum_steps) and one evaluation batch (or None)."""
    from tftrain.data import foreign, reader

    accum = config.train.grad_accum_steps
    source = foreign.load_kwargs(config.data)
    train_data = reader.load(config.data.dir, config.data.train_split, size * accum,
                             training=True, shuffle_buffer=size * accum, seed=config.train.seed,
                             **source)
    eval_data = reader.load(config.data.dir, config.data.eval_split, size, training=False,
                            drop_remainder=target.kind == "tpu", **source)
    return next(iter(train_data)), next(iter(eval_data), None)

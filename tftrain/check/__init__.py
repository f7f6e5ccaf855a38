"""`tftrain check`: a dry run of a config for a target, before paying for the hardware.

Everything that can be known without the hardware, in one report of one-line findings
(`report`): storage the target's machines can read and write (`storage`), the precision policy
(`precision`), the global batch over the replicas and the partial last batch (`batch`), Python
functions and dynamic shapes in the input pipeline (`input_pipeline`), one replica's memory
against its HBM (`memory`), and the real train and eval steps compiled by XLA and run on one
real batch (`xla`). It all runs here, on the CPU, with the default strategy: nothing connects
to a TPU or needs one.

`run` is the whole check (`tftrain check`). `before_connecting` is what `train` runs for a TPU
before it connects: the config-only part here (no TensorFlow op: the TPU must be initialized
first), which stops a bad config in milliseconds, then, when the dataset is there, the whole
check in a child process that cannot touch the TPU (`isolated`). This module does not import
TensorFlow at import time.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging as python_logging

from absl import logging

from tftrain.check import batch, hardware, input_pipeline, precision, storage
from tftrain.check.report import ADVICE, ERROR, OK, Finding, Report, Target  # noqa: F401
from tftrain.errors import ConfigError, TftrainError
from tftrain.host import available_memory

DATA_TIMEOUT = 30  # seconds to read data.dir's manifest (an unreachable gs:// bucket)
HOST_SHARE = 0.5  # run the step here only on a batch whose estimate fits this share of free RAM


def run(config, target: Target, model_dir: str | None = None,
        convert_data: bool = True) -> Report:
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
    manifest = _read_manifest(config, report, convert_data)
    report.extend(batch.check(config, target, manifest))
    if manifest is None:
        report.extend(input_pipeline.check_source(config, target))
        return report
    try:
        report.extend(input_pipeline.check(config, target))
    except _bad_input() as e:
        report.extend([_failure("input", "building the training input pipeline", e)])
    report.extend(_model_checks(config, manifest, target))
    return report


def before_connecting(config, model_dir: str | None, convert_data: bool = True) -> Report | None:
    """`tftrain check --target=tpu` before connecting to the TPU; raises ConfigError on an error.

    Only for a TPU run (`runtime.strategy=tpu`, or `auto` with `runtime.tpu`); None otherwise.
    The target is the slice `TPU_ACCELERATOR_TYPE` names, else 8 replicas assumed.

    First, here, without a TensorFlow op: storage, precision, the batch split and Python
    functions in the pipeline's decode source; an error stops the run at once. The TensorFlow
    guide asks for the TPU to be initialized at the beginning of the program, and tracing a
    tf.data function already starts the runtime, so the rest (the input pipeline's graph, the
    memory estimate, the train and eval steps compiled by XLA) runs in a child process with
    libtpu and GPUs hidden (`isolated.run`), when `data.dir` holds the dataset; without it
    (converted after connecting, or unreadable from here) they are skipped, said at `-v 1`.
    `convert_data` is `train`'s: whether a missing dataset would be converted. Advice is logged;
    returns the report (the child's, when it ran).
    """
    runtime = config.runtime
    if not (runtime.strategy == "tpu" or (runtime.strategy == "auto" and runtime.tpu)):
        return None
    tpu_type, replicas, assumed = hardware.tpu_from_environment()
    target = Target("tpu", replicas, tpu_type, runtime.tpu or "local", assumed)
    report = Report(target)
    report.extend(storage.check(config, target, model_dir, convert_data))
    report.extend(precision.check(config, target))
    report.extend(batch.check(config, target))
    report.extend(input_pipeline.check_source(config, target))
    if not report.of(ERROR) and (config.data.format == "tfrecord"
                                 or _read_manifest(config, report, convert_data) is not None):
        from tftrain.check import isolated

        report = isolated.run(config, target, model_dir, convert_data) or report
    elif not report.of(ERROR):  # no dataset yet, or unreadable from here: said at -v 1 only
        skipped = [f for f in report.findings if f.family == "data" and f.status == ADVICE]
        for finding in skipped:
            logging.debug("%s: %s", BEFORE_CONNECTING, finding.message())
        report.findings = [f for f in report.findings if f not in skipped]
    raise_errors(report.findings, BEFORE_CONNECTING)
    return report


BEFORE_CONNECTING = "before connecting to the TPU"


def raise_errors(findings: list[Finding], when: str) -> list[str]:
    """Raises ConfigError naming every error, one line each; logs and returns the advice.

    One error is one line (`when: what; fix: ...`); several are a first line that counts them,
    then each error's report line.
    """
    errors = [f for f in findings if f.status == ERROR]
    if len(errors) == 1:
        raise ConfigError(f"{when}: {errors[0].message()}")
    if errors:
        raise ConfigError("\n".join([f"{when}: {len(errors)} errors:"]
                                    + [f.line() for f in errors]))
    advice = [f.message() for f in findings if f.status == ADVICE]
    for line in advice:
        logging.warning("%s", line)
    return advice


def _bad_input() -> tuple:
    """What a bad config, model or dataset raises while the check builds what train builds."""
    import tensorflow as tf

    return TftrainError, ValueError, TypeError, tf.errors.OpError


def _failure(family: str, what: str, error: BaseException) -> Finding:
    return Finding(ERROR, family, f"{what} failed: {_first_line(error)}",
                   "fix it: `tftrain train` would stop there too")


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def _read_manifest(config, report: Report, convert_data: bool = True) -> dict | None:
    """The dataset's manifest, with a `data` finding; None (and why) when it cannot be read.

    Only the first look at `data.dir` is bounded by DATA_TIMEOUT (an unreachable gs:// bucket);
    `data.format=tfrecord` then counts the records, as `train` does.
    """
    from tftrain.runtime import distribute
    from tftrain.data import foreign
    from tftrain.data import manifest as manifest_lib
    from tftrain.data import reader

    data = config.data
    skipped = "skipped the checks that need the data (input pipeline graph, memory, xla)"
    local_copy = "--params_override=data.dir=<a converted copy> checks them here"

    def probe() -> bool:
        if data.format == "tfrecord":
            return bool(reader.foreign_files(data.dir, data.train_split))
        return manifest_lib.exists(data.dir)

    try:
        found = distribute.run_bounded(probe, DATA_TIMEOUT, "data-probe")
        manifest = foreign.read_manifest(data) if found else None
    except TimeoutError:
        report.extend([Finding(ADVICE, "data", f"data.dir={data.dir} did not answer within "
                               f"{DATA_TIMEOUT}s; {skipped}", local_copy)])
        return None
    except TftrainError as e:  # a corrupt manifest, foreign files that do not match, ...
        report.extend([Finding(ERROR, "data", f"data.dir={data.dir}: {_first_line(e)}",
                               "fix the dataset: `tftrain train` would stop there too")])
        return None
    except Exception as e:  # noqa: BLE001  gfile raises many kinds (no network, no credentials)
        report.extend([Finding(ADVICE, "data", f"cannot read data.dir={data.dir} from here "
                               f"({_first_line(e)}); {skipped}",
                               f"run the check where it is readable, or {local_copy}")])
        return None
    if manifest is None:
        how = storage.converts_on_first_use(data, convert_data)
        if how:
            report.extend([Finding(ADVICE, "data", f"data.dir={data.dir} holds no dataset yet "
                                   f"(for train it is {how}); {skipped}",
                                   f"`tftrain convert --pipeline={data.pipeline} "
                                   f"--output={data.dir}` first, or {local_copy}")])
        else:
            report.extend([Finding(ERROR, "data", f"data.dir={data.dir} holds no dataset "
                                   "(no dataset.json) and nothing to convert it from (data.source "
                                   "is empty)", f"convert it first: `tftrain convert --pipeline="
                                   f"{data.pipeline} --input=... --output={data.dir}`")])
        return None
    splits = manifest.get("splits", {})
    wanted = dict.fromkeys((data.train_split, data.eval_split, data.test_split))
    missing = [s for s in wanted if s not in splits]
    counts = ", ".join(f"{name} {info.get('num_examples', '?')}" for name, info in splits.items())
    if missing:
        report.extend([Finding(ERROR, "data", f"data.dir={data.dir} has no split "
                               f"{', '.join(map(repr, missing))} (it has: {counts})",
                               "set data.train_split/eval_split/test_split to existing splits, "
                               "or convert with --splits=...")])
        return None
    report.extend([Finding(OK, "data", f"data.dir={data.dir}: pipeline {manifest.get('pipeline')}, "
                           f"splits {counts}")])
    return manifest


def _model_checks(config, manifest: dict, target: Target) -> list[Finding]:
    """Builds the model as `train` does, under the target's policy: memory, then the steps."""
    import tensorflow as tf
    import tf_keras as keras

    from tftrain.check import memory, xla
    from tftrain.engine import backends, train
    from tftrain.engine import precision as precision_lib

    policy = precision.policy_for(config, target)
    compiled, how = xla.uses_xla(config, target)
    accum = config.train.grad_accum_steps
    plan = train.plan_steps(config.train,
                            manifest["splits"][config.data.train_split]["num_examples"],
                            config.data.batch_size * accum)
    # One step per call: train_on_batch feeds one batch, and XLA compiles the same step function
    # whatever steps_per_execution is (it only loops over it).
    one_step = dataclasses.replace(config, train=dataclasses.replace(config.train,
                                                                     steps_per_execution=1))
    previous = keras.mixed_precision.global_policy().name
    try:
        with _hiding_device_warning():
            precision_lib.set_policy(policy, tf.distribute.get_strategy())
        keras.utils.set_random_seed(config.train.seed)
        try:
            model, trainer = backends.build_and_compile(one_step, manifest, plan,
                                                        jit_compile=compiled)
        except _bad_input() as e:
            return [_failure("model", f"building model.name={config.model.name}", e)]
        estimate = memory.estimate(model, config, target, policy)
        findings = [memory.check(estimate, config, target, policy)]
        size = _host_batch(estimate)
        if size == 0:
            findings.append(Finding(ADVICE, "xla", "steps not run: the weights and optimizer state "
                                    f"(~{memory.size(estimate.state_bytes)}) do not fit "
                                    "in this machine's free memory", "run the check on a larger "
                                    "machine to compile the steps"))
            return findings
        train_batch, eval_batch = _one_batch(config, target, size)
        if size < estimate.batch:
            findings.append(Finding(ADVICE, "xla", f"steps run on {size} examples instead of one "
                                    f"replica's {estimate.batch}, to fit this machine's free "
                                    "memory (the same ops compile; only the sizes differ)"))
        return findings + xla.check(trainer, model, train_batch, eval_batch, how, policy)
    finally:
        keras.mixed_precision.set_global_policy(previous)


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


def _host_batch(estimate) -> int:
    """One replica's batch, reduced to fit HOST_SHARE of this machine's free memory (0: none)."""
    free = available_memory()
    if free is None:
        return estimate.batch
    budget = HOST_SHARE * free - estimate.state_bytes
    if budget <= 0:
        return 0
    return max(1, min(estimate.batch, int(budget // max(estimate.bytes_per_example, 1))))


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

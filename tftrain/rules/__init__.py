"""The rules a run must keep, checked from the config and the data alone (no model, no device).

Storage the target's machines can read and write (`storage`), the precision policy
(`precision`), the global batch over the replicas and the partial last batch (`batch`), Python
functions and dynamic shapes in the input pipeline (`input_pipeline`), each a list of one-line
findings (`report`). `tftrain check` (the dry run above the engine, `tftrain.check`) runs them
and then builds the model; `train` runs them for a TPU before connecting (`before_connecting`),
and `runtime.tpu` after connecting. This package imports nothing above the data layer, and no
TensorFlow at import time.
"""
from __future__ import annotations

from absl import logging

from tftrain.errors import ConfigError, TftrainError, first_line
from tftrain.rules import batch, hardware, input_pipeline, isolated, precision, storage
from tftrain.rules.report import ADVICE, ERROR, OK, Finding, Report, Target
from tftrain.timeout import run_bounded

DATA_TIMEOUT = 30  # seconds to read data.dir's manifest (an unreachable gs:// bucket)


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
                                 or read_manifest(config, report, convert_data) is not None):
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


def bad_input() -> tuple:
    """What a bad config, model or dataset raises while the check builds what train builds."""
    import tensorflow as tf

    return TftrainError, ValueError, TypeError, tf.errors.OpError


def failure(family: str, what: str, error: BaseException) -> Finding:
    """An error finding for a step of building what train builds that raised `error`."""
    return Finding(ERROR, family, f"{what} failed: {first_line(error)}",
                   "fix it: `tftrain train` would stop there too")


def _options_flag(data) -> str:
    """` --pipeline_options=k=v,...` for the config's pipeline options ('' when none)."""
    if not data.pipeline_options:
        return ""
    return " --pipeline_options=" + ",".join(f"{k}={v}" for k, v in data.pipeline_options.items())


def read_manifest(config, report: Report, convert_data: bool = True) -> dict | None:
    """The dataset's manifest, with a `data` finding; None (and why) when it cannot be read.

    Only the first look at `data.dir` is bounded by DATA_TIMEOUT (an unreachable gs:// bucket);
    `data.format=tfrecord` then counts the records, as `train` does.
    """
    from tftrain.data import foreign, reader  # TensorFlow: only when the data is read
    from tftrain.data import manifest as manifest_lib

    data = config.data
    skipped = "skipped the checks that need the data (input pipeline graph, memory, xla)"
    local_copy = "--params_override=data.dir=<a converted copy> checks them here"

    def probe() -> bool:
        if data.format == "tfrecord":
            return bool(reader.foreign_files(data.dir, data.train_split))
        return manifest_lib.exists(data.dir)

    try:
        found = run_bounded(probe, DATA_TIMEOUT, "data-probe")
        manifest = foreign.read_manifest(data) if found else None
    except TimeoutError:
        report.extend([Finding(ADVICE, "data", f"data.dir={data.dir} did not answer within "
                               f"{DATA_TIMEOUT}s; {skipped}", local_copy)])
        return None
    except TftrainError as e:  # a corrupt manifest, foreign files that do not match, ...
        report.extend([Finding(ERROR, "data", f"data.dir={data.dir}: {first_line(e)}",
                               "fix the dataset: `tftrain train` would stop there too")])
        return None
    except Exception as e:  # noqa: BLE001  gfile raises many kinds (no network, no credentials)
        report.extend([Finding(ADVICE, "data", f"cannot read data.dir={data.dir} from here "
                               f"({first_line(e)}); {skipped}",
                               f"run the check where it is readable, or {local_copy}")])
        return None
    if manifest is None:
        how = storage.converts_on_first_use(data, convert_data)
        if how:
            report.extend([Finding(ADVICE, "data", f"data.dir={data.dir} holds no dataset yet "
                                   f"(for train it is {how}); {skipped}",
                                   f"`tftrain convert --pipeline={data.pipeline} "
                                   f"--output={data.dir}{_options_flag(data)}` first, or "
                                   f"{local_copy}")])
        else:
            report.extend([Finding(ERROR, "data", f"data.dir={data.dir} holds no dataset "
                                   "(no dataset.json) and nothing to convert it from (data.source "
                                   "is empty)", f"convert it first: `tftrain convert --pipeline="
                                   f"{data.pipeline} --input=... --output={data.dir}`")])
        return None
    manifest = manifest_lib.typed(manifest)
    wanted = dict.fromkeys((data.train_split, data.eval_split, data.test_split))
    missing = [s for s in wanted if s not in manifest.splits]
    counts = ", ".join(f"{name} {'?' if split.num_examples is None else split.num_examples}"
                       for name, split in manifest.splits.items())
    if missing:
        report.extend([Finding(ERROR, "data", f"data.dir={data.dir} has no split "
                               f"{', '.join(map(repr, missing))} (it has: {counts})",
                               "set data.train_split/eval_split/test_split to existing splits, "
                               "or convert with --splits=...")])
        return None
    report.extend([Finding(OK, "data", f"data.dir={data.dir}: pipeline {manifest.pipeline}, "
                           f"splits {counts}")])
    return manifest

"""`tftrain prune` and `tftrain quantize` over a run directory, under the run's own config.

Both read the run's `params.yaml` (strategy, its whole data section through
`engine.run_config.RunData`, batch size, optimizer), load `export/` (or
`pruned/`), measure every result against the float model on the evaluation split (or on its
first `eval_steps` batches, the same for every model: `tftrain.optimize.bounds`), and write a
report before any gate can fail, so a failed run still leaves its numbers behind.
"""
from __future__ import annotations

import dataclasses
import gc

import tensorflow as tf
import tf_keras as keras
from absl import logging

from tftrain import config as config_lib
from tftrain import run_dir
from tftrain.engine import export, run_config, train
from tftrain.training import optimizers
from tftrain.runtime import cluster, distribute
from tftrain.data import reader
from tftrain.data import manifest as manifest_lib
from tftrain.errors import ConfigError, TftrainError
from tftrain.fileio import join, remove, write_atomic, write_json
from tftrain.optimize import bounds, distill, finetune, metrics, prune, quantize, report, sizes
from tftrain.optimize import tflite_eval
from tftrain.optimize.keras_model import (custom_gradients, forget_custom_gradients,
                                           load_keras_model)
from tftrain.tasks import r2_metric  # noqa: F401  (registers R2: regression SavedModels load)

SOURCES = ("export", "pruned")
# In quantized/ while `tftrain quantize` runs: the model as a plain float32 SavedModel, which
# every post-training conversion reads (`quantize.save_float32`); removed before it ends.
FLOAT32_SAVED_MODEL = "float32_saved_model.tmp"


def check_gate(task, max_change: float | None, flag: str) -> None:
    """Raises ConfigError when `flag` (which bounds `max_change`) is not the task's gate, or
    bounds it below 0."""
    if max_change is None:
        return
    if flag != task.gate_flag:
        raise ConfigError(f"{flag} bounds the change of another task's measure; this run's task "
                          f"is {task.name}: bound its {task.measure} with {task.gate_flag}")
    if max_change < 0:
        raise ConfigError(f"{flag}={max_change} must be >= 0")


def model_path(model_dir: str, source: str = "export") -> str:
    """The SavedModel directory of `source` (`export`: the highest version in export/, or the
    SavedModel directly in an earlier tftrain's export/; `pruned`), which must exist."""
    if source not in SOURCES:
        raise ConfigError(f"--source={source!r}: choose export (the trained model) or pruned")
    path = join(model_dir, run_dir.EXPORT if source == "export" else report.PRUNED)
    found = export.saved_model_dir(path)
    if found is None:
        how = ("the run has not finished: train it with `tftrain train --model_dir=...`"
               if source == "export" else f"prune it first: tftrain prune --model_dir={model_dir}")
        where = f"{path}/<version>/" if source == "export" else f"{path}/"
        raise TftrainError(f"no {source} model in {model_dir} (no {where}saved_model.pb); "
                           f"{how}.")
    return found


def _strategy(config: config_lib.Config):
    if config.runtime.strategy == "dtensor":
        raise ConfigError("this run trained with runtime.strategy=dtensor; pruning and "
                          "quantization-aware training run under tf.distribute strategies: pass "
                          "--strategy=one_device (or mirrored)")
    strategy = distribute.create_strategy(config.runtime)
    config_lib.check_divisible(config.data.batch_size, strategy.num_replicas_in_sync)
    return strategy


def _eval_data(config: config_lib.Config, split: str | None, steps: int | None = None):
    """`(split, dataset)`: the evaluation split (default: the run's test split) read as the
    run reads it, in its batches, bounded to its first `steps` batches (None or 0: all)."""
    data = run_config.RunData(config.data)
    split = data.split(split)
    return split, bounds.bounded(data.load(split), steps or 0)


def _train_data(config: config_lib.Config, strategy):
    """The run's training input (same reader, split, global batch, shuffling), repeated, and the
    number of steps in one pass over it."""
    data = run_config.RunData(config.data)
    num_examples = manifest_lib.typed(data.manifest()).examples(config.data.train_split)
    steps_per_epoch = config.train.steps_per_epoch or max(1, num_examples // config.data.batch_size)
    dataset = reader.load_distributed(
        strategy, config.data.dir, config.data.train_split, config.data.batch_size, training=True,
        shuffle_buffer=config.data.shuffle_buffer, cache=config.data.cache, repeat=True,
        seed=config.train.seed, **data.load_kwargs())
    return dataset, steps_per_epoch


def fine_tuning_rate(config: config_lib.Config, learning_rate: float | None) -> float:
    """`learning_rate` when given, else a quarter of the run's `train.learning_rate`."""
    return learning_rate or config.train.learning_rate / 4


def _optimizer_fn(config: config_lib.Config, learning_rate: float | None, steps_per_epoch: int,
                  epochs: int):
    """The run's optimizer (`train.optimizer`), its rate decaying (cosine) from `learning_rate`,
    by default a quarter of the run's `train.learning_rate` (fine-tuning starts from a trained
    model), to 0 at the last fine-tuning step, so the model ends settled, not mid-jump. No
    moving average (`train.ema_decay`): it starts from the export, which is the run's average
    already, and an average of pruned weights would not be sparse."""
    train_config = dataclasses.replace(
        config.train, learning_rate=fine_tuning_rate(config, learning_rate),
        lr_schedule="cosine", lr_min=0.0, warmup_steps=0, ema_decay=0.0)
    return lambda: optimizers.make_optimizer(train_config, steps_per_epoch,
                                             steps_per_epoch * epochs)


def _tflite_measure(content: bytes, path: str, eval_data, max_examples: int | None,
                    task) -> dict:
    """Writes a .tflite and evaluates it (the task's metrics) with the interpreter on the
    evaluation data (its times come from `_timed`)."""
    write_atomic(path, content)
    result = tflite_eval.evaluate_tflite(content, eval_data, task=task, max_examples=max_examples,
                                         latency_rounds=1)
    return {"path": path, "content": content, "evaluated": result}


def _timed(measured: dict, eval_data, num_threads: int,
           bounded: bool = False) -> dict[str, report.TfliteMeasurement]:
    """Each `_tflite_measure` entry as a record, with its times from one interleaved comparison
    of all the models: `latency_ms` (batch 1, a request) and `throughput_ms_per_example` (batch
    `throughput_batch_size`), with their batch sizes, `num_threads` and the `cpu`.

    `bounded` (--steps): the throughput batch holds at most the examples measured; filling
    256 by repeating them would multiply the bounded measurement's time and memory (a batch of
    256 windows of a large language model holds gigabytes of activations)."""
    batch_size = tflite_eval.THROUGHPUT_BATCH_SIZE
    if bounded:
        batch_size = min([batch_size] + [entry["evaluated"]["num_examples"]
                                         for entry in measured.values()])
    latencies = tflite_eval.compare_latencies(
        {name: entry["content"] for name, entry in measured.items()}, eval_data,
        num_threads=num_threads, batch_size=batch_size)
    return {name: report.TfliteMeasurement.of(entry["path"], entry["evaluated"], latencies[name])
            for name, entry in measured.items()}


def _run_and_task(model_dir: str, strategy_name: str | None):
    """`(config, task)` of a finished run: its params.yaml (optionally with another strategy)
    and the task it trained."""
    config = run_config.read(model_dir, strategy_name)
    return config, run_config.run_task(config)


def _output_dir(model_dir: str, name: str) -> str:
    """`model_dir/name` (pruned/, quantized/), refused when it holds what tftrain did not write."""
    out = join(model_dir, name)
    run_dir.check_replaceable(out)
    return out


def _verbosity() -> int:
    """Keras `fit` verbosity of fine-tuning: a line per epoch when absl logs at INFO."""
    return 2 if logging.level_info() else 0


def _gate_line(task, was: float, now: float, change: float, limit: float) -> str:
    """Why a model fails the task's gate: its measure against the float model's, and the
    change against the flag's bound."""
    return (f"{task.measure} {now:.4f} vs float {was:.4f} ({task.change_name} {change:.4f} > "
            f"{task.gate_flag}={limit})")


@dataclasses.dataclass(frozen=True)
class PruneOptions:
    """What `tftrain prune` was asked for (see `prune_run`)."""

    target_sparsity: float = 0.8
    m_by_n: str | None = None
    epochs: int | None = None
    schedule: str = "polynomial"
    learning_rate: float | None = None
    min_weights: int = prune.DEFAULT_MIN_WEIGHTS
    distill_weight: float = distill.DEFAULT_WEIGHT
    temperature: float = distill.DEFAULT_TEMPERATURE
    max_metric_change: float | None = None
    eval_steps: int | None = None  # batches of the evaluation split measured; 0/None: all

    @property
    def structure(self):
        """The m:n structure of `m_by_n`, or None."""
        return prune.parse_m_by_n(self.m_by_n)

    def check(self) -> None:
        """Raises ConfigError for a target or a number of epochs that cannot be pruned to."""
        prune.check_target_sparsity(self.target_sparsity)
        self.structure  # noqa: B018  (parses --sparsity_m_by_n: a bad one is refused first)
        if self.epochs is not None and self.epochs < 1:
            raise ConfigError(f"--epochs={self.epochs}: pruning needs at least one fine-tuning "
                              "epoch")
        bounds.check_steps(self.eval_steps)


def prune_run(model_dir: str, *, target_sparsity: float = 0.8, m_by_n: str | None = None,
              epochs: int | None = None, schedule: str = "polynomial",
              learning_rate: float | None = None, min_weights: int = prune.DEFAULT_MIN_WEIGHTS,
              distill_weight: float = distill.DEFAULT_WEIGHT,
              temperature: float = distill.DEFAULT_TEMPERATURE, split: str | None = None,
              strategy_name: str | None = None, num_threads: int = 1,
              max_eval_examples: int | None = None, max_metric_change: float | None = None,
              allow_python: bool = False, eval_steps: int = 0,
              strategy=None) -> dict:
    """Prunes `model_dir/export` under the run's strategy, data and optimizer; writes `pruned/`.

    Fine-tuned with the task's loss and measured with its metrics (`tftrain.tasks`); a
    regression run with `max_metric_change` fails (after writing the report) when the pruned
    model's RMSE is more than that fraction above the float model's.

    `epochs=None` fine-tunes for `prune.finetune_epochs` of the training split (enough steps
    for the data, whatever its size); `distill_weight` and `temperature`: see
    `prune.prune_model`. `eval_steps` > 0 measures every model (the float and the pruned one,
    in Keras and as .tflite) on the same first `eval_steps` batches of the evaluation split
    only; the report gives each measurement's `num_examples` and the bound (`eval_steps`).
    Returns the report also written to `pruned/report.json`.
    Raises `TftrainError` after writing it when a pruned layer missed its target sparsity (or
    its m:n structure).
    """
    options = PruneOptions(target_sparsity, m_by_n, epochs, schedule, learning_rate, min_weights,
                           distill_weight, temperature, max_metric_change, eval_steps)
    options.check()
    config, task = _run_and_task(model_dir, strategy_name)
    check_gate(task, max_metric_change, "--max_metric_change")
    source = model_path(model_dir, "export")
    out = _output_dir(model_dir, report.PRUNED)
    # The strategy comes first: no TensorFlow op may run before it is built.
    strategy = strategy or _strategy(config)
    # One writer per run directory: not while it is trained, pruned or quantized elsewhere.
    with run_dir.lock(model_dir, "tftrain prune", cluster.is_chief(strategy)):
        keras.utils.set_random_seed(config.train.seed)
        train_data, steps_per_epoch = _train_data(config, strategy)
        split, eval_data = _eval_data(config, split, options.eval_steps)
        epochs = options.epochs or prune.finetune_epochs(steps_per_epoch)
        model = load_keras_model(source, allow_python=allow_python)
        before = _keras_measure(model, eval_data, task)
        result = _prune(model, train_data, config, task, options, strategy,
                        steps_per_epoch=steps_per_epoch, epochs=epochs)
        after = _keras_measure(result.model, eval_data, task, result.pruned_weights,
                               options.structure)
        _export(result.model, out, strategy)
        if not cluster.is_chief(strategy):  # multi-worker: the chief measures and reports
            return {"sparsity": after.sparsity,
                    f"{task.measure}_after": after.metrics[task.measure]}
        tflite = _timed({name: _tflite_measure(quantize.convert(m, "float"),
                                               join(out, f"{name}.tflite"), eval_data,
                                               max_eval_examples, task)
                         for name, m in (("float", model), ("model", result.model))},
                        eval_data, num_threads, bounded=bool(options.eval_steps))
        summary = _pruning_report(result, before, after, tflite, config, task, options, strategy,
                                  source=source, split=split, steps_per_epoch=steps_per_epoch,
                                  epochs=epochs)
        write_json(join(out, report.REPORT), summary.to_json())
        logging.info("pruned model and report in %s", out)
        _prune_gate(summary, out)
        return summary.to_json()


def _keras_measure(model, eval_data, task, pruned_weights: set[str] | None = None,
                   structure=None, *, gzip: bool = True) -> report.KerasMeasurement:
    """A Keras model's sparsity (`pruned_weights`: the weights it counts; `structure`: the m:n
    structure to check), the task's metrics on the evaluation data and the examples they were
    measured on, its weights' gzip size (`gzip=False`: None; it copies every weight twice)."""
    sparsity = prune.sparsity_report(model, pruned_weights, structure)
    measured, num_examples = metrics.keras_measure(model, eval_data, task)
    return report.KerasMeasurement(
        metrics=measured, gzip_bytes=sizes.gzip_weights_bytes(model) if gzip else None,
        num_examples=num_examples, **sparsity)


def _prune(model, train_data, config: config_lib.Config, task, options: PruneOptions, strategy,
           *, steps_per_epoch: int, epochs: int) -> prune.PruneResult:
    """Prunes a clone of `model` while fine-tuning it for `epochs` on the run's training input
    with the task's loss and the run's optimizer."""
    return prune.prune_model(
        model, train_data, steps_per_epoch=steps_per_epoch, epochs=epochs,
        target_sparsity=options.target_sparsity, m_by_n=options.structure,
        schedule=options.schedule, min_weights=options.min_weights,
        distill_weight=options.distill_weight, temperature=options.temperature,
        loss=finetune.training_loss(model, task),
        optimizer_fn=_optimizer_fn(config, options.learning_rate, steps_per_epoch, epochs),
        strategy=strategy, verbose=_verbosity())


def _export(model, out: str, strategy) -> None:
    """Saves `model` to `out`: every worker takes part in the save, the non-chief ones into a
    temporary directory."""
    written = cluster.write_dir_for(out, strategy)
    train.export(model, written)
    cluster.cleanup(written, out)


def _pruning_report(result: prune.PruneResult, before: report.KerasMeasurement,
                    after: report.KerasMeasurement, tflite: dict, config: config_lib.Config,
                    task, options: PruneOptions, strategy, *, source: str, split: str,
                    steps_per_epoch: int, epochs: int) -> report.PruneReport:
    """pruned/report.json: the settings, the float and pruned models (Keras and .tflite), and
    the problems that fail the run: a layer short of its sparsity, a change over the gate."""
    was, now = before.metrics[task.measure], after.metrics[task.measure]
    change, limit = task.change(was, now), options.max_metric_change
    problems = prune.check_sparsity_reached(dataclasses.asdict(after), options.target_sparsity,
                                            options.structure)
    if limit is not None and change > limit + 1e-9:
        problems.append(_gate_line(task, was, now, change, limit))
    return report.PruneReport(
        source=source, split=split, strategy=distribute.strategy_name(strategy),
        num_replicas=strategy.num_replicas_in_sync,
        target_sparsity=None if options.structure else options.target_sparsity,
        sparsity_m_by_n=options.m_by_n or None, schedule=dataclasses.asdict(result.schedule),
        epochs=epochs, steps_per_epoch=steps_per_epoch,
        learning_rate=fine_tuning_rate(config, options.learning_rate),
        distill_weight=options.distill_weight if result.distilled else 0.0,
        distill_temperature=options.temperature if result.distilled else None,
        task=task.name, measure=task.measure, change_name=task.change_name, change=change,
        before=before, after=after, float_tflite=tflite["float"], tflite=tflite["model"],
        unsupported_layers=result.unsupported_layers, min_weights_to_prune=options.min_weights,
        small_layers=result.small_layers, problems=tuple(problems), max_metric_change=limit,
        eval_steps=options.eval_steps)


def _prune_gate(summary: report.PruneReport, out: str) -> None:
    """Raises TftrainError (the report is written) when the pruned model has problems."""
    if summary.problems:
        raise TftrainError(f"pruning missed its target ({'; '.join(summary.problems)}); "
                           f"the report is in {out}/{report.REPORT}. Fine-tune longer "
                           "(--epochs), prune less, or check the layers named.")


@dataclasses.dataclass(frozen=True)
class QuantizeOptions:
    """What `tftrain quantize` was asked for (see `quantize_run`)."""

    modes: list
    source: str = "export"
    max_accuracy_drop: float = 0.01
    max_metric_change: float = 0.05
    int8_io: bool = False
    qat_epochs: int = 1
    qat_learning_rate: float | None = None
    num_calibration_examples: int = 100
    max_eval_examples: int | None = None
    eval_steps: int | None = None  # batches of the evaluation split measured; 0/None: all

    def check(self) -> None:
        """Raises ConfigError for a mode, a gate or a bound that cannot be."""
        for mode in self.modes:
            quantize.check_mode(mode)
        if not self.modes:
            raise ConfigError("--mode is empty: give dynamic, int8, float16 or qat")
        for flag, value in (("--max_accuracy_drop", self.max_accuracy_drop),
                            ("--max_metric_change", self.max_metric_change)):
            if value < 0:
                raise ConfigError(f"{flag}={value} must be >= 0")
        bounds.check_steps(self.eval_steps)

    def max_change(self, task) -> float:
        """The bound of the task's gate flag."""
        return {"--max_accuracy_drop": self.max_accuracy_drop,
                "--max_metric_change": self.max_metric_change}[task.gate_flag]

    def int8_io_for(self, mode: str) -> bool:
        """Whether `mode`'s model takes and gives int8 (only int8 and qat can)."""
        return bool(self.int8_io and mode in ("int8", "qat"))


def quantize_run(model_dir: str, modes: list[str], *, source: str = "export",
                 max_accuracy_drop: float = 0.01, max_metric_change: float = 0.05,
                 int8_io: bool = False, qat_epochs: int = 1,
                 qat_learning_rate: float | None = None, num_calibration_examples: int = 100,
                 split: str | None = None, strategy_name: str | None = None,
                 num_threads: int = 1, max_eval_examples: int | None = None,
                 strategy=None, allow_python: bool = False,
                 eval_steps: int = 0) -> list[dict]:
    """Quantizes `model_dir`'s `source` model in each of `modes`; writes `quantized/`.

    Every .tflite is evaluated with the interpreter on the evaluation split, with the task's
    metrics (`eval_steps` > 0: on the same first `eval_steps` batches only; each report gives
    `num_examples`, `float_num_examples` and `eval_steps`), against the float reference
    measured on the same batches: the float conversion of the same source, or, when that
    would exceed LiteRT's flatbuffer limit, the float32 Keras model (`quantize.float_reference`).
    A mode whose .tflite would exceed the limit, or a conversion this machine's memory cannot
    hold, is refused (ConfigError) before any conversion or output. Returns the reports;
    raises `TftrainError` after writing them when a model falls short of the task's gate: an
    accuracy drop above `max_accuracy_drop` (classification, absolute), or a change of the
    task's measure (RMSE, perplexity) more than `max_metric_change` for the worse (relative).
    """
    options = QuantizeOptions(modes, source, max_accuracy_drop, max_metric_change, int8_io,
                              qat_epochs, qat_learning_rate, num_calibration_examples,
                              max_eval_examples, eval_steps)
    options.check()
    config, task = _run_and_task(model_dir, strategy_name)
    path = model_path(model_dir, source)
    out = _output_dir(model_dir, report.QUANTIZED)
    if "qat" in modes and strategy is None:
        strategy = _strategy(config)  # first: no TensorFlow op may run before it is built
    with run_dir.lock(model_dir, "tftrain quantize", cluster.is_chief(strategy)):
        split, eval_data = _eval_data(config, split, options.eval_steps)
        gradients = custom_gradients()
        model = load_keras_model(path, allow_python=allow_python)
        reference = quantize.check_quantizable(model.count_params(), modes)
        run_dir.mark_output(out)
        keras_reference = (_keras_measure(model, eval_data, task, gzip=False)
                           if reference == quantize.KERAS else None)
        if not cluster.is_chief(strategy):  # multi-worker qat: the chief converts and reports
            if "qat" in modes:
                _qat_trained(model, config, task, options, strategy)
            return []
        saved = _temporary_output(out, FLOAT32_SAVED_MODEL)
        model_name = model.name  # the conversions' errors name it
        try:
            quantize.save_float32(model, saved)
            if "qat" not in modes:  # the conversions read the SavedModel: its memory goes back
                model = None
                forget_custom_gradients(since=gradients)
            gc.collect()
            contents, extras = _conversions(saved, model, reference, config, task, options,
                                            strategy, name=model_name)
        finally:
            remove(saved, within=out)
        model = None  # the interpreters below need the memory of its weights (qat kept it)
        forget_custom_gradients(since=gradients)
        gc.collect()
        measured = {name: _tflite_measure(content, join(out, f"model_{name}.tflite"),
                                          eval_data, options.max_eval_examples, task)
                    for name, content in contents.items()}
        timed = _timed(measured, eval_data, num_threads, bounded=bool(options.eval_steps))
        reports = [_quantized_report(mode, options, task, timed, path=path, split=split,
                                     extra=extras[mode], keras_reference=keras_reference)
                   for mode in modes]
        _write_and_gate(model_dir, reports, task, out)
        return [entry.to_json() for entry in reports]


def _temporary_output(out: str, name: str) -> str:
    """`out/name`, a directory that tftrain writes and removes within one command: refused when
    it holds what tftrain did not write, cleared when an earlier command stopped before removing
    it, then created with tftrain's marker."""
    path = join(out, name)
    run_dir.check_replaceable(path)
    remove(path, within=out)
    run_dir.mark_output(path)
    return path


def _conversions(saved: str, model, reference: str, config: config_lib.Config, task,
                 options: QuantizeOptions, strategy, *, name: str) -> tuple[dict, dict]:
    """`({name: .tflite bytes}, {mode: the report's extra fields})`: the float conversion when
    it is the reference, then each mode, converted from the plain SavedModel `saved`
    (`quantize.save_float32`) of the model `name`; qat from `model` after quantization-aware
    training."""
    contents, extras = {}, {}
    if reference == quantize.TFLITE:
        contents[report.model_name("float", options.source)] = quantize.convert_saved_model(
            saved, "float", name=name)
    for mode in options.modes:
        contents[report.model_name(mode, options.source)], extras[mode] = _quantize(
            saved, model, mode, config, task, options, strategy, name=name)
    return contents, extras


def _quantize(saved: str, model, mode: str, config: config_lib.Config, task,
              options: QuantizeOptions, strategy, *, name: str) -> tuple[bytes, dict]:
    """`(the .tflite of mode, the report's extra fields)`: from the SavedModel `saved`,
    calibrated on the training split for int8; for qat from `model` after quantization-aware
    training."""
    if mode == "qat":
        trained, extra = _qat_trained(model, config, task, options, strategy)
        return quantize.convert(trained, mode, int8_io=options.int8_io_for(mode)), extra
    calibration, extra = None, {}
    if mode == "int8":
        calibration = run_config.RunData(config.data).load(  # decoded as validation: no augment
            config.data.train_split, training=True, seed=config.train.seed, last_stage="decode")
        extra = {"num_calibration_examples": options.num_calibration_examples}
    content = quantize.convert_saved_model(
        saved, mode, representative_data=calibration,
        num_calibration_examples=options.num_calibration_examples,
        int8_io=options.int8_io_for(mode), name=name)
    return content, extra


def _qat_trained(model, config: config_lib.Config, task, options: QuantizeOptions, strategy):
    """`(the model after quantization-aware training, the report's extra fields)` (qat; every
    worker of a multi-worker run trains)."""
    train_data, steps_per_epoch = _train_data(config, strategy)
    trained, float_layers = quantize.quantization_aware_training(
        model, train_data, steps_per_epoch=steps_per_epoch, epochs=options.qat_epochs,
        preserve_sparsity=options.source == "pruned", loss=finetune.training_loss(model, task),
        optimizer_fn=_optimizer_fn(config, options.qat_learning_rate, steps_per_epoch,
                                   options.qat_epochs),
        strategy=strategy, verbose=_verbosity())
    return trained, {"float_layers": float_layers, "qat_epochs": options.qat_epochs}


def _quantized_report(mode: str, options: QuantizeOptions, task, timed: dict, *, path: str,
                      split: str, extra: dict,
                      keras_reference: report.KerasMeasurement | None = None
                      ) -> report.QuantizeReport:
    """quantized/report_<name>.json: `mode`'s model against the float reference (the float
    .tflite in `timed`, or `keras_reference`), the task's measure and its gate."""
    result = timed[report.model_name(mode, options.source)]
    float_tflite = (None if keras_reference is not None
                    else timed[report.model_name("float", options.source)])
    reference = float_tflite or keras_reference
    return report.QuantizeReport(
        mode=mode, source=options.source, model=path, split=split, task=task.name,
        measure=task.measure, change_name=task.change_name,
        change=task.change(reference.metrics[task.measure], result.metrics[task.measure]),
        max_change=options.max_change(task),
        metrics={k: result.metrics[k] for k in task.evaluate_keys(result.metrics)},
        float_metrics={k: reference.metrics[k] for k in task.evaluate_keys(reference.metrics)},
        tflite=result, float_tflite=float_tflite, int8_io=options.int8_io_for(mode),
        eval_steps=options.eval_steps, float_keras=keras_reference, **extra)


def _write_and_gate(model_dir: str, reports: list[report.QuantizeReport], task,
                    out: str) -> None:
    """Writes each report, then raises TftrainError when a model failed the task's gate."""
    failures = []
    for entry in reports:
        report_path = report.write_quantized_report(model_dir, entry)
        if not entry.passed:
            line = _gate_line(task, entry.float_measure,
                              entry.tflite.metrics[entry.measure], entry.change,
                              entry.max_change)
            failures.append(f"{report.model_name(entry.mode, entry.source)}: {line}; report "
                            f"kept at {report_path}")
    logging.info("quantized models and reports in %s", out)
    if failures:
        raise TftrainError(f"quantization lost too much {task.measure}: " + "; ".join(failures))

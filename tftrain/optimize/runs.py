"""`tftrain prune` and `tftrain quantize` over a run directory, under the run's own config.

Both read the run's `params.yaml` (strategy, data, batch size, optimizer), load `export/` (or
`pruned/`), measure every result against the float model on the evaluation split, and write a
report before any gate can fail, so a failed run still leaves its numbers behind.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf
import tf_keras as keras
from absl import logging

from tftrain import config as config_lib
from tftrain import data as data_lib
from tftrain import run_dir, tasks
from tftrain.engine import export, train
from tftrain.training import optimizers
from tftrain.runtime import cluster, distribute
from tftrain.data import foreign, reader
from tftrain.data import manifest as manifest_lib
from tftrain.errors import ConfigError, TftrainError
from tftrain.fileio import join, write_atomic, write_json
from tftrain.optimize import distill, finetune, metrics, prune, quantize, report, sizes
from tftrain.optimize import tflite_eval
from tftrain.optimize.keras_model import load_keras_model
from tftrain.tasks import r2_metric  # noqa: F401  (registers R2: regression SavedModels load)

SOURCES = ("export", "pruned")


def load_run_config(model_dir: str, strategy_name: str | None = None) -> config_lib.Config:
    """The resolved config of a finished run (`params.yaml`), optionally with another strategy."""
    params = join(model_dir, run_dir.PARAMS)
    if not tf.io.gfile.exists(params):
        raise TftrainError(f"{model_dir} is not a tftrain run directory (no {run_dir.PARAMS}); "
                           "pass the --model_dir of a `tftrain train` run.")
    config = config_lib.from_yaml_file(params)
    if strategy_name:
        config.runtime.strategy = strategy_name
        config_lib.validate(config)
    return config


def run_task(config: config_lib.Config):
    """The task a finished run trained (its params.yaml's `task`), on its dataset."""
    return tasks.from_config(config, foreign.read_manifest(config.data), training=False)


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


def _eval_data(config: config_lib.Config, split: str | None):
    split = split or config.data.test_split
    return split, data_lib.load(config.data.dir, split, config.data.batch_size, training=False,
                                **foreign.load_kwargs(config.data))


def _train_data(config: config_lib.Config, strategy):
    """The run's training input (same reader, split, global batch, shuffling), repeated, and the
    number of steps in one pass over it."""
    num_examples = manifest_lib.typed(foreign.read_manifest(config.data)).examples(
        config.data.train_split)
    steps_per_epoch = config.train.steps_per_epoch or max(1, num_examples // config.data.batch_size)
    dataset = reader.load_distributed(
        strategy, config.data.dir, config.data.train_split, config.data.batch_size, training=True,
        shuffle_buffer=config.data.shuffle_buffer, cache=config.data.cache, repeat=True,
        seed=config.train.seed, **foreign.load_kwargs(config.data))
    return dataset, steps_per_epoch


def fine_tuning_rate(config: config_lib.Config, learning_rate: float | None) -> float:
    """`learning_rate` when given, else a quarter of the run's `train.learning_rate`."""
    return learning_rate or config.train.learning_rate / 4


def _optimizer_fn(config: config_lib.Config, learning_rate: float | None, steps_per_epoch: int,
                  epochs: int):
    """The run's optimizer (`train.optimizer`), its rate decaying (cosine) from `learning_rate`,
    by default a quarter of the run's `train.learning_rate` (fine-tuning starts from a trained
    model), to 0 at the last fine-tuning step, so the model ends settled, not mid-jump."""
    train_config = dataclasses.replace(
        config.train, learning_rate=fine_tuning_rate(config, learning_rate),
        lr_schedule="cosine", lr_min=0.0, warmup_steps=0)
    return lambda: optimizers.make_optimizer(train_config, steps_per_epoch,
                                             steps_per_epoch * epochs)


def _tflite_measure(content: bytes, path: str, eval_data, max_examples: int | None,
                    task) -> dict:
    """Writes a .tflite and evaluates it (the task's metrics) with the interpreter on the
    evaluation data (its times come from `_add_latencies`)."""
    write_atomic(path, content)
    result = tflite_eval.evaluate_tflite(content, eval_data, task=task, max_examples=max_examples,
                                         latency_rounds=1)
    return {"path": path, "content": content, **result}


def _add_latencies(measured: dict, eval_data, num_threads: int) -> None:
    """Sets each entry's times from one interleaved comparison of all the models: `latency_ms`
    (batch 1, a request) and `throughput_ms_per_example` (batch `throughput_batch_size`), with
    their batch sizes, `num_threads` and the `cpu`."""
    latencies = tflite_eval.compare_latencies(
        {name: entry["content"] for name, entry in measured.items()}, eval_data,
        num_threads=num_threads)
    for name, entry in measured.items():
        entry.update(latencies[name])
        del entry["content"]


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


def prune_run(model_dir: str, *, target_sparsity: float = 0.8, m_by_n: str | None = None,
              epochs: int | None = None, schedule: str = "polynomial",
              learning_rate: float | None = None, min_weights: int = prune.DEFAULT_MIN_WEIGHTS,
              distill_weight: float = distill.DEFAULT_WEIGHT,
              temperature: float = distill.DEFAULT_TEMPERATURE, split: str | None = None,
              strategy_name: str | None = None, num_threads: int = 1,
              max_eval_examples: int | None = None, max_metric_change: float | None = None,
              allow_python: bool = False,
              strategy=None) -> dict:
    """Prunes `model_dir/export` under the run's strategy, data and optimizer; writes `pruned/`.

    Fine-tuned with the task's loss and measured with its metrics (`tftrain.tasks`); a
    regression run with `max_metric_change` fails (after writing the report) when the pruned
    model's RMSE is more than that fraction above the float model's.

    `epochs=None` fine-tunes for `prune.finetune_epochs` of the training split (enough steps
    for the data, whatever its size); `distill_weight` and `temperature`: see
    `prune.prune_model`. Returns the report also written to `pruned/report.json`.
    Raises `TftrainError` after writing it when a pruned layer missed its target sparsity (or
    its m:n structure).
    """
    options = PruneOptions(target_sparsity, m_by_n, epochs, schedule, learning_rate, min_weights,
                           distill_weight, temperature, max_metric_change)
    options.check()
    config = load_run_config(model_dir, strategy_name)
    task = run_task(config)
    check_gate(task, max_metric_change, "--max_metric_change")
    source = model_path(model_dir, "export")
    out = join(model_dir, report.PRUNED)
    run_dir.check_replaceable(out)
    # The strategy comes first: no TensorFlow op may run before it is built.
    strategy = strategy or _strategy(config)
    # One writer per run directory: not while it is trained, pruned or quantized elsewhere.
    with run_dir.lock(model_dir, "tftrain prune", cluster.is_chief(strategy)):
        keras.utils.set_random_seed(config.train.seed)
        split, eval_data = _eval_data(config, split)
        model = load_keras_model(source, allow_python=allow_python)
        pruned = _prune(model, config, task, options, strategy, eval_data)
        _export(pruned.result.model, out, strategy)
        if not cluster.is_chief(strategy):
            return {"sparsity": pruned.after["sparsity"],
                    f"{task.measure}_after": pruned.measured_after[task.measure]}
        tflite = {name: _tflite_measure(quantize.convert(m, "float"), join(out, f"{name}.tflite"),
                                        eval_data, max_eval_examples, task)
                  for name, m in (("float", model), ("model", pruned.result.model))}
        _add_latencies(tflite, eval_data, num_threads)
        summary = _pruning_report(pruned, model, config, task, options, strategy, tflite,
                                  source=source, split=split)
        write_json(join(out, report.REPORT), summary)
        logging.info("pruned model and report in %s", out)
        if summary["problems"]:
            raise TftrainError(f"pruning missed its target ({'; '.join(summary['problems'])}); "
                               f"the report is in {out}/{report.REPORT}. Fine-tune longer "
                               "(--epochs), prune less, or check the layers named.")
        return summary


@dataclasses.dataclass(frozen=True)
class Pruned:
    """A pruning pass and what it measured: the pruned model (`result`), sparsity reports and
    the task's metrics before and after, and the fine-tuning it took."""

    result: object  # prune.PruneResult
    before: dict
    after: dict
    measured_before: dict
    measured_after: dict
    epochs: int
    steps_per_epoch: int


def _prune(model, config: config_lib.Config, task, options: PruneOptions, strategy,
           eval_data) -> Pruned:
    """Measures `model`, prunes it while fine-tuning on the run's training input, measures it
    again."""
    train_data, steps_per_epoch = _train_data(config, strategy)
    epochs = options.epochs or prune.finetune_epochs(steps_per_epoch)
    before = prune.sparsity_report(model)
    measured_before = metrics.keras_metrics(model, eval_data, task)
    result = prune.prune_model(
        model, train_data, steps_per_epoch=steps_per_epoch, epochs=epochs,
        target_sparsity=options.target_sparsity, m_by_n=options.structure,
        schedule=options.schedule, min_weights=options.min_weights,
        distill_weight=options.distill_weight, temperature=options.temperature,
        loss=finetune.training_loss(model, task),
        optimizer_fn=_optimizer_fn(config, options.learning_rate, steps_per_epoch, epochs),
        strategy=strategy, verbose=2 if logging.level_info() else 0)
    after = prune.sparsity_report(result.model, result.pruned_weights, options.structure)
    return Pruned(result, before, after, measured_before,
                  metrics.keras_metrics(result.model, eval_data, task), epochs, steps_per_epoch)


def _export(model, out: str, strategy) -> None:
    """Saves `model` to `out`: every worker takes part in the save, the non-chief ones into a
    temporary directory."""
    written = cluster.write_dir_for(out, strategy)
    train.export(model, written)
    cluster.cleanup(written, out)


def _pruning_report(pruned: Pruned, model, config: config_lib.Config, task,
                    options: PruneOptions, strategy, tflite: dict, *, source: str,
                    split: str) -> dict:
    """pruned/report.json: the settings, the sparsity, sizes and the task's measure before and
    after, the layers, both TFLite measurements, and the problems that fail the run."""
    measure, result, after, before = task.measure, pruned.result, pruned.after, pruned.before
    was, now = pruned.measured_before[measure], pruned.measured_after[measure]
    summary = {
        "source": source, "split": split, "strategy": distribute.strategy_name(strategy),
        "num_replicas": strategy.num_replicas_in_sync,
        "target_sparsity": None if options.structure else options.target_sparsity,
        "sparsity_m_by_n": options.m_by_n or None,
        "schedule": dataclasses.asdict(result.schedule),
        "epochs": pruned.epochs, "steps_per_epoch": pruned.steps_per_epoch,
        "learning_rate": fine_tuning_rate(config, options.learning_rate),
        "distill_weight": options.distill_weight if result.distilled else 0.0,
        "distill_temperature": options.temperature if result.distilled else None,
        "sparsity": after["sparsity"], "sparsity_before": before["sparsity"],
        "num_params": after["num_params"], "pruned_params": after["pruned_params"],
        "nonzero_params_before": before["nonzero_params"],
        "nonzero_params_after": after["nonzero_params"],
        "gzip_bytes_before": sizes.gzip_weights_bytes(model),
        "gzip_bytes_after": sizes.gzip_weights_bytes(result.model),
        "task": task.name, "measure": measure, f"{measure}_before": was,
        f"{measure}_after": now, task.change_name: task.change(was, now),
        "metrics_before": pruned.measured_before, "metrics_after": pruned.measured_after,
        "unsupported_layers": result.unsupported_layers,
        "min_weights_to_prune": options.min_weights, "small_layers": result.small_layers,
        "layers": after["layers"], "float_tflite": tflite["float"], "tflite": tflite["model"],
    }
    summary["gzip_ratio"] = summary["gzip_bytes_after"] / summary["gzip_bytes_before"]
    summary["problems"] = prune.check_sparsity_reached(after, options.target_sparsity,
                                                       options.structure)
    limit = options.max_metric_change
    if limit is not None:
        summary["max_metric_change"] = limit
        if summary[task.change_name] > limit + 1e-9:
            summary["problems"].append(
                f"{measure} {now:.4f} vs float {was:.4f} ({task.change_name} "
                f"{summary[task.change_name]:.4f} > --max_metric_change={limit})")
    return summary


def quantize_run(model_dir: str, modes: list[str], *, source: str = "export",
                 max_accuracy_drop: float = 0.01, max_metric_change: float = 0.05,
                 int8_io: bool = False, qat_epochs: int = 1,
                 qat_learning_rate: float | None = None, num_calibration_examples: int = 100,
                 split: str | None = None, strategy_name: str | None = None,
                 num_threads: int = 1, max_eval_examples: int | None = None,
                 strategy=None, allow_python: bool = False) -> list[dict]:
    """Quantizes `model_dir`'s `source` model in each of `modes`; writes `quantized/`.

    Every .tflite (and the float conversion of the same source, the reference) is evaluated with
    the interpreter on the evaluation split, with the task's metrics. Returns the reports;
    raises `TftrainError` after writing them when a model falls short of the task's gate: an
    accuracy drop above `max_accuracy_drop` (classification, absolute), or an RMSE more than
    `max_metric_change` above the float model's (regression, relative).
    """
    options = QuantizeOptions(modes, source, max_accuracy_drop, max_metric_change, int8_io,
                              qat_epochs, qat_learning_rate, num_calibration_examples,
                              max_eval_examples)
    options.check()
    config = load_run_config(model_dir, strategy_name)
    task = run_task(config)
    path = model_path(model_dir, source)
    out = join(model_dir, report.QUANTIZED)
    run_dir.check_replaceable(out)
    if "qat" in modes and strategy is None:
        strategy = _strategy(config)  # first: no TensorFlow op may run before it is built
    with run_dir.lock(model_dir, "tftrain quantize", cluster.is_chief(strategy)):
        split, eval_data = _eval_data(config, split)
        model = load_keras_model(path, allow_python=allow_python)
        run_dir.mark_output(out)
        measured, extras = _quantize_all(model, config, task, options, strategy, eval_data, out)
        if measured is None:  # multi-worker: the chief converts and reports
            return []
        _add_latencies(measured, eval_data, num_threads)
        reports, failures = [], []
        for mode in modes:
            entry, gate = _quantized_entry(mode, options, task, measured, path=path,
                                           split=split, extra=extras[mode])
            report_path = report.write_quantized_report(model_dir, entry)
            reports.append(entry)
            if not entry["passed"]:
                failures.append(f"{report.model_name(mode, source)}: {gate}; report kept at "
                                f"{report_path}")
        logging.info("quantized models and reports in %s", out)
        if failures:
            raise TftrainError(f"quantization lost too much {task.measure}: "
                               + "; ".join(failures))
        return reports


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

    def check(self) -> None:
        """Raises ConfigError for a mode or a gate that cannot be."""
        for mode in self.modes:
            quantize.check_mode(mode)
        if not self.modes:
            raise ConfigError("--mode is empty: give dynamic, int8, float16 or qat")
        for flag, value in (("--max_accuracy_drop", self.max_accuracy_drop),
                            ("--max_metric_change", self.max_metric_change)):
            if value < 0:
                raise ConfigError(f"{flag}={value} must be >= 0")

    def max_change(self, task) -> float:
        """The bound of the task's gate flag."""
        return {"--max_accuracy_drop": self.max_accuracy_drop,
                "--max_metric_change": self.max_metric_change}[task.gate_flag]

    def int8_io_for(self, mode: str) -> bool:
        """Whether `mode`'s model takes and gives int8 (only int8 and qat can)."""
        return bool(self.int8_io and mode in ("int8", "qat"))


def _quantize_all(model, config: config_lib.Config, task, options: QuantizeOptions, strategy,
                  eval_data, out: str):
    """`(measured, extras)`: the float reference and each mode's .tflite, written to `out` and
    measured; None for `measured` on a non-chief worker after quantization-aware training."""
    float_name = report.model_name("float", options.source)
    measured = {float_name: _tflite_measure(
        quantize.convert(model, "float"), join(out, f"model_{float_name}.tflite"), eval_data,
        options.max_eval_examples, task)}
    extras = {}
    for mode in options.modes:
        to_convert, extras[mode] = _converted_input(model, mode, config, task, options, strategy)
        if to_convert is None:
            return None, extras
        calibration = None
        if mode == "int8":
            calibration = data_lib.load(config.data.dir, config.data.train_split,
                                        config.data.batch_size, training=True,
                                        seed=config.train.seed)
        content = quantize.convert(to_convert, mode, representative_data=calibration,
                                   num_calibration_examples=options.num_calibration_examples,
                                   int8_io=options.int8_io_for(mode))
        name = report.model_name(mode, options.source)
        measured[name] = _tflite_measure(content, join(out, f"model_{name}.tflite"), eval_data,
                                         options.max_eval_examples, task)
    return measured, extras


def _converted_input(model, mode: str, config: config_lib.Config, task,
                     options: QuantizeOptions, strategy):
    """`(model to convert, the report's extra keys)` for `mode`: the model itself, or for qat
    the model after quantization-aware training (None on a non-chief worker)."""
    if mode == "int8":
        return model, {"num_calibration_examples": options.num_calibration_examples}
    if mode != "qat":
        return model, {}
    train_data, steps_per_epoch = _train_data(config, strategy)
    trained, float_layers = quantize.quantization_aware_training(
        model, train_data, steps_per_epoch=steps_per_epoch, epochs=options.qat_epochs,
        preserve_sparsity=options.source == "pruned", loss=finetune.training_loss(model, task),
        optimizer_fn=_optimizer_fn(config, options.qat_learning_rate, steps_per_epoch,
                                   options.qat_epochs),
        strategy=strategy, verbose=2 if logging.level_info() else 0)
    extra = {"float_layers": float_layers, "qat_epochs": options.qat_epochs}
    return (trained if cluster.is_chief(strategy) else None), extra


def _quantized_entry(mode: str, options: QuantizeOptions, task, measured: dict, *, path: str,
                     split: str, extra: dict) -> tuple[dict, str]:
    """quantized/<name>.json: `mode`'s model against the float reference, the task's measure
    and the gate (`passed`); and the line that says how it stands against the gate."""
    measure, max_change = task.measure, options.max_change(task)
    result = measured[report.model_name(mode, options.source)]
    reference = measured[report.model_name("float", options.source)]
    change = task.change(reference[measure], result[measure])
    both = result["throughput_ms_per_example"] and reference["throughput_ms_per_example"]
    gate = (f"{measure} {result[measure]:.4f} vs float {reference[measure]:.4f} "
            f"({task.change_name} {change:.4f} > {task.gate_flag}={max_change})")
    return {
        "mode": mode, "source": options.source, "model": path, "split": split,
        "tflite_path": result["path"], "tflite_bytes": result["tflite_bytes"],
        "gzip_bytes": result["gzip_bytes"], "task": task.name, "measure": measure,
        measure: result[measure], "latency_ms": result["latency_ms"],
        "throughput_ms_per_example": result["throughput_ms_per_example"],
        **{key: result[key] for key in report.TIMING_SETTINGS + ("cpu",)},
        "num_examples": result["num_examples"], "float_tflite_path": reference["path"],
        "float_tflite_bytes": reference["tflite_bytes"],
        "float_gzip_bytes": reference["gzip_bytes"], f"float_{measure}": reference[measure],
        "float_latency_ms": reference["latency_ms"],
        "float_throughput_ms_per_example": reference["throughput_ms_per_example"],
        task.change_name: change, f"max_{task.change_name}": max_change,
        "metrics": {k: result[k] for k in task.evaluate_keys(result)},
        "float_metrics": {k: reference[k] for k in task.evaluate_keys(reference)},
        "size_ratio": result["tflite_bytes"] / reference["tflite_bytes"],
        "latency_ratio": result["latency_ms"] / reference["latency_ms"],
        "throughput_ratio": (result["throughput_ms_per_example"]
                             / reference["throughput_ms_per_example"] if both else None),
        "int8_io": options.int8_io_for(mode),
        "passed": change <= max_change + 1e-9, **extra,
    }, gate

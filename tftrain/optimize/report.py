"""Report files of `pruned/` and `quantized/`, and the float / pruned / quantized comparison table.

Layout inside a run directory:

    pruned/report.json                    prune: sparsity, sizes, the task's measure (accuracy,
                                          or rmse for regression) before/after
    quantized/report_<name>.json          one per quantized model, <name> = <mode> for the
                                          export, pruned_<mode> for --source=pruned
    quantized/report.json                 the report of the latest quantized model
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from tftrain.fileio import join, read_json, write_json
from tftrain.run_dir import PRUNED, QUANTIZED
REPORT = "report.json"


def model_name(mode: str, source: str = "export") -> str:
    """`int8` for the export, `pruned_int8` for the pruned model."""
    return mode if source == "export" else f"{source}_{mode}"


def quantized_report_path(run_dir: str, mode: str, source: str = "export") -> str:
    """Where the report of one quantized model goes."""
    return join(run_dir, QUANTIZED, f"report_{model_name(mode, source)}.json")


def write_quantized_report(run_dir: str, report: QuantizeReport | dict) -> str:
    """Writes `report` (a `QuantizeReport`, or its JSON) to its own file and to
    `quantized/report.json`; returns the first path."""
    if isinstance(report, QuantizeReport):
        report = report.to_json()
    tf.io.gfile.makedirs(join(run_dir, QUANTIZED))
    path = quantized_report_path(run_dir, report["mode"], report["source"])
    write_json(path, report)
    write_json(join(run_dir, QUANTIZED, REPORT), report)
    return path


def _read_if_exists(path: str) -> dict | None:
    return read_json(path) if tf.io.gfile.exists(path) else None


# What one model's entry in a report holds (quantize reports: also with a `float_` prefix)
# besides the task's measure (`accuracy`, `rmse`: the entry's `measure`), and the settings its
# times were measured with.
MEASURED = ("tflite_bytes", "gzip_bytes", "latency_ms", "throughput_ms_per_example")
TIMING_SETTINGS = ("latency_batch_size", "throughput_batch_size", "num_threads")
# What `tflite_eval.evaluate_tflite` returns besides the task's metrics.
EVALUATED = ("latency_ms", "latency_batch_size", "num_threads", "num_examples", "tflite_bytes",
             "gzip_bytes")


@dataclasses.dataclass(frozen=True)
class TfliteMeasurement:
    """One .tflite model measured on the evaluation split: the task's metrics (`accuracy`, ...,
    or `rmse`, ... for regression), its sizes, and its times from one interleaved comparison
    with the other models of its report (`tflite_eval.compare_latencies`)."""

    path: str
    metrics: dict  # the task's metrics (`Task.evaluate`)
    num_examples: int
    tflite_bytes: int
    gzip_bytes: int
    latency_ms: float  # batch 1, a request
    latency_batch_size: int
    throughput_ms_per_example: float | None  # None: the model does not run at that batch
    throughput_batch_size: int
    num_threads: int
    cpu: str | None

    @classmethod
    def of(cls, path: str, evaluated: dict, timed: dict) -> TfliteMeasurement:
        """From `evaluate_tflite`'s result and the model's entry of `compare_latencies`, whose
        times and settings replace the evaluation's."""
        numbers = {**evaluated, **timed}
        return cls(path=path,
                   metrics={k: v for k, v in evaluated.items() if k not in EVALUATED},
                   num_examples=numbers["num_examples"], tflite_bytes=numbers["tflite_bytes"],
                   gzip_bytes=numbers["gzip_bytes"], latency_ms=numbers["latency_ms"],
                   latency_batch_size=numbers["latency_batch_size"],
                   throughput_ms_per_example=numbers["throughput_ms_per_example"],
                   throughput_batch_size=numbers["throughput_batch_size"],
                   num_threads=numbers["num_threads"], cpu=numbers["cpu"])

    def to_json(self) -> dict:
        """An entry of pruned/report.json (`float_tflite`, `tflite`): the metrics' keys beside
        the path, sizes and times (what `measured_of` reads)."""
        fields = dataclasses.asdict(self)
        del fields["metrics"]
        return {**self.metrics, **fields}


@dataclasses.dataclass(frozen=True)
class KerasMeasurement:
    """One Keras model measured by `tftrain prune`: the task's metrics on the evaluation split,
    its weights' sparsity and parameter counts (`prune.sparsity_report`), their gzip size."""

    metrics: dict  # the task's metrics (`Task.evaluate`)
    sparsity: float
    pruned_params: int
    num_params: int
    nonzero_params: int
    layers: list  # per layer: params, nonzero_params and, for the pruned ones, sparsity
    gzip_bytes: int | None  # sizes.gzip_weights_bytes; None: not measured (quantize)
    num_examples: int | None = None  # the examples `metrics` were measured on (counted)


@dataclasses.dataclass(frozen=True)
class PruneReport:
    """pruned/report.json: the settings of the pass, the float model (`before`) and the pruned
    one (`after`) as Keras models and as .tflite files, and the problems that fail the run."""

    source: str  # the SavedModel pruned
    split: str  # the evaluation split
    strategy: str
    num_replicas: int
    target_sparsity: float | None  # None under an m:n structure
    sparsity_m_by_n: str | None
    schedule: dict  # prune.Schedule as a dict
    epochs: int
    steps_per_epoch: int
    learning_rate: float
    distill_weight: float  # 0.0 when not distilled
    distill_temperature: float | None  # None when not distilled
    task: str
    measure: str  # the task's gate measure: accuracy, rmse, ...
    change_name: str  # how the task names `change`: accuracy_drop, metric_change
    change: float  # how much worse `after` is on `measure` (> 0: worse)
    before: KerasMeasurement
    after: KerasMeasurement
    float_tflite: TfliteMeasurement
    tflite: TfliteMeasurement
    unsupported_layers: list
    min_weights_to_prune: int
    small_layers: list
    problems: tuple = ()
    max_metric_change: float | None = None  # the gate, when one was given
    eval_steps: int | None = None  # the bound: batches of `split` measured (0: all of them)

    def to_json(self) -> dict:
        """The report's JSON: settings, `<measure>_before` / `_after` and the other numbers
        with a `_before` / `_after` suffix (`num_examples_before` / `_after`: the examples each
        Keras model was measured on), the pruned model's counts and layers, the change under
        the task's `change_name`; `eval_steps` when the record has the bound."""
        before, after, measure = self.before, self.after, self.measure
        data = {
            "source": self.source, "split": self.split, "strategy": self.strategy,
            "num_replicas": self.num_replicas, "target_sparsity": self.target_sparsity,
            "sparsity_m_by_n": self.sparsity_m_by_n, "schedule": self.schedule,
            "epochs": self.epochs, "steps_per_epoch": self.steps_per_epoch,
            "learning_rate": self.learning_rate, "distill_weight": self.distill_weight,
            "distill_temperature": self.distill_temperature,
            "sparsity": after.sparsity, "sparsity_before": before.sparsity,
            "num_params": after.num_params, "pruned_params": after.pruned_params,
            "nonzero_params_before": before.nonzero_params,
            "nonzero_params_after": after.nonzero_params,
            "gzip_bytes_before": before.gzip_bytes, "gzip_bytes_after": after.gzip_bytes,
            "task": self.task, "measure": measure,
            f"{measure}_before": before.metrics[measure],
            f"{measure}_after": after.metrics[measure], self.change_name: self.change,
            "metrics_before": before.metrics, "metrics_after": after.metrics,
            "unsupported_layers": self.unsupported_layers,
            "min_weights_to_prune": self.min_weights_to_prune,
            "small_layers": self.small_layers, "layers": after.layers,
            "float_tflite": self.float_tflite.to_json(), "tflite": self.tflite.to_json(),
            "gzip_ratio": after.gzip_bytes / before.gzip_bytes, "problems": list(self.problems),
        }
        if self.max_metric_change is not None:
            data["max_metric_change"] = self.max_metric_change
        optional = {"eval_steps": self.eval_steps, "num_examples_before": before.num_examples,
                    "num_examples_after": after.num_examples}
        return {**data, **{key: value for key, value in optional.items() if value is not None}}


@dataclasses.dataclass(frozen=True)
class QuantizeReport:
    """quantized/report_<name>.json: one quantized model (`tflite`) against the float model of
    the same SavedModel, and the task's gate. The float reference is its .tflite
    (`float_tflite`) or, when that would exceed LiteRT's flatbuffer limit, the float32 Keras
    model itself (`float_keras`), measured on the same batches."""

    mode: str
    source: str  # export or pruned
    model: str  # the SavedModel quantized
    split: str  # the evaluation split
    task: str
    measure: str  # the task's gate measure: accuracy, rmse, ...
    change_name: str  # how the task names `change`: accuracy_drop, metric_change
    change: float  # how much worse `tflite` is on `measure` (> 0: worse)
    max_change: float  # the gate
    metrics: dict  # the task's reported metrics of `tflite` (`Task.evaluate_keys`)
    float_metrics: dict  # ... and of the float reference
    tflite: TfliteMeasurement
    float_tflite: TfliteMeasurement | None  # None: the reference is `float_keras`
    int8_io: bool
    float_layers: list | None = None  # qat: the layers left float
    qat_epochs: int | None = None  # qat
    num_calibration_examples: int | None = None  # int8
    eval_steps: int | None = None  # the bound: batches of `split` measured (0: all of them)
    float_keras: KerasMeasurement | None = None  # the reference when there is no float_tflite

    @property
    def passed(self) -> bool:
        """Whether the change stays within the gate."""
        return self.change <= self.max_change + 1e-9

    @property
    def reference(self) -> str:
        """What the float model measured is: `tflite` (its conversion) or `keras`."""
        return "tflite" if self.float_tflite is not None else "keras"

    @property
    def float_measure(self) -> float:
        """The float reference's value of the task's measure."""
        reference = self.float_tflite or self.float_keras
        return reference.metrics[self.measure]

    def to_json(self) -> dict:
        """The report's JSON: the model's numbers under their own names, the float model's
        with a `float_` prefix, their ratios, the change and its bound (`max_<change_name>`);
        with the evaluation's bound (`eval_steps`), the float model's `float_num_examples`.
        `reference` says what the float model is: against the Keras model its .tflite fields
        and the ratios to them are None, and the size is compared with its float32 weights
        (`float32_weights_bytes`, `size_ratio_to_float32_weights`)."""
        result, measure = self.tflite, self.measure
        data = {
            "mode": self.mode, "source": self.source, "model": self.model, "split": self.split,
            "tflite_path": result.path, "tflite_bytes": result.tflite_bytes,
            "gzip_bytes": result.gzip_bytes, "task": self.task, "measure": measure,
            measure: result.metrics[measure], "latency_ms": result.latency_ms,
            "throughput_ms_per_example": result.throughput_ms_per_example,
            **{key: getattr(result, key) for key in TIMING_SETTINGS + ("cpu",)},
            "num_examples": result.num_examples, "reference": self.reference,
            **self._float_tflite_fields(), f"float_{measure}": self.float_measure,
            self.change_name: self.change, f"max_{self.change_name}": self.max_change,
            "metrics": self.metrics, "float_metrics": self.float_metrics,
            "int8_io": self.int8_io, "passed": self.passed,
        }
        reference = self.float_tflite or self.float_keras
        extras = {"float_layers": self.float_layers, "qat_epochs": self.qat_epochs,
                  "num_calibration_examples": self.num_calibration_examples,
                  "eval_steps": self.eval_steps,
                  "float_num_examples": (None if self.eval_steps is None
                                         else reference.num_examples)}
        if self.float_keras is not None:
            weights = 4 * self.float_keras.num_params
            extras.update(float32_weights_bytes=weights,
                          size_ratio_to_float32_weights=result.tflite_bytes / weights)
        return {**data, **{key: value for key, value in extras.items() if value is not None}}

    def _float_tflite_fields(self) -> dict:
        """The float .tflite's path, sizes and times, and the model's ratios to them: None
        when the reference is the Keras model (there is no float .tflite)."""
        result, reference = self.tflite, self.float_tflite
        if reference is None:
            return {key: None for key in (
                "float_tflite_path", "float_tflite_bytes", "float_gzip_bytes",
                "float_latency_ms", "float_throughput_ms_per_example", "size_ratio",
                "latency_ratio", "throughput_ratio")}
        both = result.throughput_ms_per_example and reference.throughput_ms_per_example
        return {"float_tflite_path": reference.path,
                "float_tflite_bytes": reference.tflite_bytes,
                "float_gzip_bytes": reference.gzip_bytes,
                "float_latency_ms": reference.latency_ms,
                "float_throughput_ms_per_example": reference.throughput_ms_per_example,
                "size_ratio": result.tflite_bytes / reference.tflite_bytes,
                "latency_ratio": result.latency_ms / reference.latency_ms,
                "throughput_ratio": (result.throughput_ms_per_example
                                     / reference.throughput_ms_per_example if both else None)}


# The float row's note when the quantized models were measured against the Keras model.
KERAS_REFERENCE_NOTE = "the float32 Keras model: its .tflite would exceed the flatbuffer limit"


def measured_of(entry: dict, prefix: str = "", measure: str | None = None) -> dict:
    """One model's numbers from a report entry (`prefix="float_"`: the float reference's): the
    task's `measure` (default: the entry's, else accuracy, as reports before tasks), under its
    own name and as `measure`, the examples it was measured on (`num_examples`), and the timing
    settings; keys an older report lacks are None."""
    measure = measure or entry.get("measure") or "accuracy"
    numbers = {key: entry.get(prefix + key) for key in (measure, "num_examples") + MEASURED}
    return {"measure": measure, **numbers,
            **{key: entry.get(key) for key in TIMING_SETTINGS + ("cpu",)}}


def make_row(name: str, measured: dict, float_row: dict | None, note: str = "",
             timing_reference: dict | None = None, split: str | None = None) -> dict:
    """One row of the comparison table.

    `measured`: the model's numbers (see `measured_of`); `float_row`: the reference (None for
    float itself); `timing_reference`: the float model's numbers from the same interleaved
    timing as this model, when that was not `float_row`'s (times compare only within one);
    `split`: the split it was measured on.
    """
    return {"model": name, **measured, "split": split, "float": float_row, "note": note,
            "timing_reference": timing_reference or float_row}


def comparison_rows(run_dir: str) -> list[dict]:
    """The measured models of a run: float first, then pruned, then each quantized model; each
    row names the split it was measured on (`split`, None in reports that do not say)."""
    quantized = []
    qdir = join(run_dir, QUANTIZED)
    if tf.io.gfile.isdir(qdir):
        for name in sorted(tf.io.gfile.listdir(qdir)):
            if name.startswith("report_") and name.endswith(".json"):
                quantized.append(read_json(join(qdir, name)))
    pruned = _read_if_exists(join(run_dir, PRUNED, REPORT))
    float_row = None
    reference = next((r for r in quantized if r["source"] == "export"), None)
    if reference:
        float_row = make_row("float", measured_of(reference, "float_"), None,
                             KERAS_REFERENCE_NOTE if reference.get("reference") == "keras"
                             else "", split=reference.get("split"))
    elif pruned and "float_tflite" in pruned:
        float_row = make_row("float", measured_of(pruned["float_tflite"],
                                                  measure=pruned.get("measure")), None,
                             split=pruned.get("split"))
    rows = [float_row] if float_row else []
    if pruned and "tflite" in pruned:
        sparsity = (f"{pruned['sparsity_m_by_n']} sparsity" if pruned.get("sparsity_m_by_n")
                    else f"{pruned['sparsity']:.0%} sparse")
        measure = pruned.get("measure")
        rows.append(make_row("pruned", measured_of(pruned["tflite"], measure=measure), float_row,
                             sparsity, pruned.get("float_tflite") and measured_of(
                                 pruned["float_tflite"], measure=measure),
                             split=pruned.get("split")))
    order = {"dynamic": 0, "int8": 1, "float16": 2, "qat": 3}
    for r in sorted(quantized, key=lambda r: (r["source"] != "export", order.get(r["mode"], 9))):
        rows.append(make_row(model_name(r["mode"], r["source"]), measured_of(r), float_row,
                             "" if r.get("passed", True) else
                             f"FAILED {r.get('measure', 'accuracy')} gate",
                             measured_of(r, "float_"), split=r.get("split")))
    return rows


def _settings(batch_size, num_threads) -> str:
    """` (batch 256, 1 thread)`, leaving out what is unknown (reports of older versions)."""
    parts = [f"batch {batch_size}"] if batch_size else []
    if num_threads:
        parts.append(f"{num_threads} thread{'' if num_threads == 1 else 's'}")
    return f" ({', '.join(parts)})" if parts else ""


def format_table(rows: list[dict]) -> str:
    """A markdown table: the task's measure (accuracy, or rmse for regression), .tflite size,
    gzip size, batch-1 latency and time per example at a large batch, each also relative to
    float (accuracy in points, other measures as a ratio); the header states the batch sizes
    and threads of the times (a row timed otherwise says so in its note), a line below the
    table the CPU they were measured on."""

    def ratio(row, key, reference="float"):
        base = row[reference] and row[reference][key]
        return f" ({row[key] / base:.2f}x)" if base and row[key] is not None else ""

    def ms(row, key):
        return "-" if row[key] is None else f"{row[key]:.4f}{ratio(row, key, 'timing_reference')}"

    def kib(row, key):
        return "-" if row[key] is None else f"{row[key] / 1024:.1f}{ratio(row, key)}"

    settings = [rows[0][key] for key in TIMING_SETTINGS]
    latency_batch, throughput_batch, threads = settings
    measure = rows[0].get("measure") or "accuracy"

    def score(row):
        value, base = row.get(measure), row["float"] and row["float"].get(measure)
        if value is None:
            return "-"
        if base is None:
            return f"{value:.4f}"
        if measure == "accuracy":
            return f"{value:.4f} ({100 * (value - base):+.1f} pt)"
        return f"{value:.4f} ({value / base:.3f}x)" if base else f"{value:.4f}"

    lines = [f"| model | {measure} | .tflite KiB | gzip KiB "
             f"| latency ms/example{_settings(latency_batch or 1, threads)} "
             f"| ms/example{_settings(throughput_batch, threads)} | note |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        note = row["note"]
        if [row[key] for key in TIMING_SETTINGS] != settings:
            timed = (f"timed at batch {row['latency_batch_size'] or 1}/"
                     f"{row['throughput_batch_size'] or '-'}, {row['num_threads'] or '?'} threads")
            note = f"{note}; {timed}" if note else timed
        lines.append(
            f"| {row['model']} | {score(row)} "
            f"| {kib(row, 'tflite_bytes')} | {kib(row, 'gzip_bytes')} "
            f"| {ms(row, 'latency_ms')} | {ms(row, 'throughput_ms_per_example')} | {note} |")
    notes = [note for note in (_examples_line(rows), _times_line(rows)) if note]
    if notes:  # after a blank line, so that pasted into markdown they are not rows of the table
        lines += ["", *notes]
    return "\n".join(lines)


def _examples_line(rows: list[dict]) -> str | None:
    """`examples measured: 64 per model, split test`, or each model's count (and split) when
    they differ (a report bounded by --steps beside one that was not); None when no report
    says."""
    counts = {row["model"]: row.get("num_examples") for row in rows
              if row.get("num_examples") is not None}
    if not counts:
        return None
    splits = {row["model"]: row.get("split") for row in rows if row.get("split")}
    if len(counts) == len(rows) and len(set(counts.values())) == 1 and len(
            set(splits.values())) <= 1:
        where = f", split {next(iter(splits.values()))}" if splits else ""
        return f"examples measured: {next(iter(counts.values()))} per model{where}"
    return "examples measured: " + ", ".join(
        f"{model} {n}" + (f" ({splits[model]})" if model in splits else "")
        for model, n in counts.items())


def _times_line(rows: list[dict]) -> str | None:
    """`times: LiteRT interpreter on <CPU>, ...`, or None when no report names its CPU."""
    cpus = sorted({row["cpu"] for row in rows if row.get("cpu")})
    if not cpus:
        return None
    return (f"times: LiteRT interpreter on {' / '.join(cpus)}, each the best of interleaved "
            "rounds")


def demo_table(run_dir: str) -> str:
    """The float / pruned / int8 / float16 ... table of every report in `run_dir`."""
    rows = comparison_rows(run_dir)
    if not rows:
        return f"(no prune or quantize reports in {run_dir} yet)"
    return format_table(rows)

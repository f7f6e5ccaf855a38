"""Report files of `pruned/` and `quantized/`, and the float / pruned / quantized comparison table.

Layout inside a run directory:

    pruned/report.json                    prune: sparsity, sizes, the task's measure (accuracy,
                                          or rmse for regression) before/after
    quantized/report_<name>.json          one per quantized model, <name> = <mode> for the
                                          export, pruned_<mode> for --source=pruned
    quantized/report.json                 the report of the latest quantized model
"""
from __future__ import annotations

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


def write_quantized_report(run_dir: str, report: dict) -> str:
    """Writes `report` to its own file and to `quantized/report.json`; returns the first path."""
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


def measured_of(entry: dict, prefix: str = "", measure: str | None = None) -> dict:
    """One model's numbers from a report entry (`prefix="float_"`: the float reference's): the
    task's `measure` (default: the entry's, else accuracy, as reports before tasks), under its
    own name and as `measure`, and the timing settings; keys an older report lacks are None."""
    measure = measure or entry.get("measure") or "accuracy"
    numbers = {key: entry.get(prefix + key) for key in (measure,) + MEASURED}
    return {"measure": measure, **numbers,
            **{key: entry.get(key) for key in TIMING_SETTINGS + ("cpu",)}}


def make_row(name: str, measured: dict, float_row: dict | None, note: str = "",
             timing_reference: dict | None = None) -> dict:
    """One row of the comparison table.

    `measured`: the model's numbers (see `measured_of`); `float_row`: the reference (None for
    float itself); `timing_reference`: the float model's numbers from the same interleaved
    timing as this model, when that was not `float_row`'s (times compare only within one).
    """
    return {"model": name, **measured, "float": float_row, "note": note,
            "timing_reference": timing_reference or float_row}


def comparison_rows(run_dir: str) -> list[dict]:
    """The measured models of a run: float first, then pruned, then each quantized model."""
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
        float_row = make_row("float", measured_of(reference, "float_"), None)
    elif pruned and "float_tflite" in pruned:
        float_row = make_row("float", measured_of(pruned["float_tflite"],
                                                  measure=pruned.get("measure")), None)
    rows = [float_row] if float_row else []
    if pruned and "tflite" in pruned:
        sparsity = (f"{pruned['sparsity_m_by_n']} sparsity" if pruned.get("sparsity_m_by_n")
                    else f"{pruned['sparsity']:.0%} sparse")
        measure = pruned.get("measure")
        rows.append(make_row("pruned", measured_of(pruned["tflite"], measure=measure), float_row,
                             sparsity, pruned.get("float_tflite") and measured_of(
                                 pruned["float_tflite"], measure=measure)))
    order = {"dynamic": 0, "int8": 1, "float16": 2, "qat": 3}
    for r in sorted(quantized, key=lambda r: (r["source"] != "export", order.get(r["mode"], 9))):
        rows.append(make_row(model_name(r["mode"], r["source"]), measured_of(r), float_row,
                             "" if r.get("passed", True) else
                             f"FAILED {r.get('measure', 'accuracy')} gate",
                             measured_of(r, "float_")))
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
            f"| {row['tflite_bytes'] / 1024:.1f}{ratio(row, 'tflite_bytes')} "
            f"| {row['gzip_bytes'] / 1024:.1f}{ratio(row, 'gzip_bytes')} "
            f"| {ms(row, 'latency_ms')} | {ms(row, 'throughput_ms_per_example')} | {note} |")
    cpus = sorted({row["cpu"] for row in rows if row.get("cpu")})
    if cpus:  # after a blank line, so that pasted into markdown it is not a row of the table
        lines += ["", f"times: LiteRT interpreter on {' / '.join(cpus)}, each the best of "
                      "interleaved rounds"]
    return "\n".join(lines)


def demo_table(run_dir: str) -> str:
    """The float / pruned / int8 / float16 ... table of every report in `run_dir`."""
    rows = comparison_rows(run_dir)
    if not rows:
        return f"(no prune or quantize reports in {run_dir} yet)"
    return format_table(rows)

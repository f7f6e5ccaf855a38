"""Report files of `pruned/` and `quantized/`, and the float / pruned / quantized comparison table.

Layout inside a run directory:

    pruned/report.json                    prune: sparsity, sizes, accuracy before/after
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


def make_row(name: str, accuracy: float, tflite_bytes: int, gzip_bytes: int, latency_ms: float,
             float_row: dict | None, note: str = "") -> dict:
    """One row of the comparison table; `float_row` is the reference (None for float itself)."""
    return {"model": name, "accuracy": accuracy, "tflite_bytes": tflite_bytes,
            "gzip_bytes": gzip_bytes, "latency_ms": latency_ms, "float": float_row, "note": note}


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
        float_row = make_row("float", reference["float_accuracy"], reference["float_tflite_bytes"],
                         reference["float_gzip_bytes"], reference["float_latency_ms"], None)
    elif pruned and "float_tflite" in pruned:
        f = pruned["float_tflite"]
        float_row = make_row("float", f["accuracy"], f["tflite_bytes"], f["gzip_bytes"],
                         f["latency_ms"], None)
    rows = [float_row] if float_row else []
    if pruned and "tflite" in pruned:
        t = pruned["tflite"]
        sparsity = (f"{pruned['sparsity_m_by_n']} sparsity" if pruned.get("sparsity_m_by_n")
                    else f"{pruned['sparsity']:.0%} sparse")
        rows.append(make_row("pruned", t["accuracy"], t["tflite_bytes"], t["gzip_bytes"],
                         t["latency_ms"], float_row, sparsity))
    order = {"dynamic": 0, "int8": 1, "float16": 2, "qat": 3}
    for r in sorted(quantized, key=lambda r: (r["source"] != "export", order.get(r["mode"], 9))):
        rows.append(make_row(model_name(r["mode"], r["source"]), r["accuracy"], r["tflite_bytes"],
                         r["gzip_bytes"], r["latency_ms"], float_row,
                         "" if r.get("passed", True) else "FAILED accuracy gate"))
    return rows


def format_table(rows: list[dict]) -> str:
    """A markdown table: accuracy, .tflite size, gzip size, latency, each also relative to float."""

    def ratio(row, key):
        base = row["float"] and row["float"][key]
        return f" ({row[key] / base:.2f}x)" if base else ""

    lines = ["| model | accuracy | .tflite KiB | gzip KiB | latency ms/example | note |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        delta = (f" ({100 * (row['accuracy'] - row['float']['accuracy']):+.1f} pt)"
                 if row["float"] else "")
        lines.append(
            f"| {row['model']} | {row['accuracy']:.4f}{delta} "
            f"| {row['tflite_bytes'] / 1024:.1f}{ratio(row, 'tflite_bytes')} "
            f"| {row['gzip_bytes'] / 1024:.1f}{ratio(row, 'gzip_bytes')} "
            f"| {row['latency_ms']:.4f}{ratio(row, 'latency_ms')} | {row['note']} |")
    return "\n".join(lines)


def demo_table(run_dir: str) -> str:
    """The float / pruned / int8 / float16 ... table of every report in `run_dir`."""
    rows = comparison_rows(run_dir)
    if not rows:
        return f"(no prune or quantize reports in {run_dir} yet)"
    return format_table(rows)

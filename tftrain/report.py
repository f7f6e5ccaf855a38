"""`tftrain report RUN [RUN...]`: a table comparing runs, and a picture of their validation curves.

The table has a row per run: its epochs, the task's metrics on the evaluation split
(`summary.json` `eval`: a classifier's include its macro-F1) and on the validation split (the
last epoch's), training speed, strategy and replicas, precision, and the accuracy and gzip size
of each pruned or quantized model that `tftrain prune` / `tftrain quantize` measured (their
report.json files; each such column names the split they were measured on). The picture has
one subplot per validation metric and one line per run, from each run's `curves.json`.

An unfinished run (no summary.json yet: still training, or killed) is shown with what it has:
the epochs recorded so far and the last one's validation metrics; the columns that only a
finished run knows are `-`.
"""
from __future__ import annotations

import dataclasses
import posixpath

import tensorflow as tf

from tftrain import run_dir as run_dir_lib
from tftrain.callbacks import curves
from tftrain.errors import TftrainError
from tftrain.fileio import join, read_json, write_atomic
from tftrain.optimize import report as optimize_report

DEFAULT_OUTPUT = "report.png"
MISSING = "-"


@dataclasses.dataclass(frozen=True)
class Run:
    """What one run directory holds for the report."""

    path: str
    summary: dict | None  # None: the run has not finished
    history: list[dict]  # curves.json's epochs
    optimized: list[dict]  # optimize.report.comparison_rows: float, pruned, quantized models

    @property
    def name(self) -> str:
        """The run directory's own name."""
        return posixpath.basename(self.path.rstrip("/")) or self.path

    def validation(self) -> dict:
        """The validation metrics: the summary's, else the last recorded epoch's."""
        if self.summary:
            return self.summary.get("validation", {})
        last = self.history[-1] if self.history else {}
        return {k[4:]: v for k, v in last.items() if k.startswith("val_")}


def load_run(path: str) -> Run:
    """Reads a run directory; TftrainError when `path` is not one."""
    if not run_dir_lib.contents(path).is_run:
        raise TftrainError(f"{path} is not a tftrain run directory (no {run_dir_lib.PARAMS}); "
                           "pass the --model_dir of `tftrain train` runs: "
                           "tftrain report RUN [RUN...]")
    summary_path = join(path, run_dir_lib.SUMMARY)
    summary = read_json(summary_path) if tf.io.gfile.exists(summary_path) else None
    return Run(path, summary, curves.read_history(path), optimize_report.comparison_rows(path))


def labels(runs: list[Run]) -> list[str]:
    """Each run's label: its directory's name, or its path where two runs share a name."""
    names = [run.name for run in runs]
    return [run.name if names.count(run.name) == 1 else run.path for run in runs]


def _union(lists) -> list:
    return list(dict.fromkeys(item for items in lists for item in items))


def _number(value, digits: int = 4) -> str:
    return MISSING if value is None else f"{value:.{digits}f}"


def table(runs: list[Run]) -> str:
    """The markdown table comparing `runs` (see the module doc)."""
    finished = [run.summary for run in runs if run.summary]
    splits = {s.get("eval", {}).get("split", "eval") for s in finished}
    eval_name = splits.pop() if len(splits) == 1 else "eval"
    # the numbers (a classifier's per_class and confusion_matrix are not columns; macro_f1 is)
    eval_metrics = _union([k for k, v in s.get("eval", {}).items() if k != "split" and
                           isinstance(v, (int, float)) and not isinstance(v, bool)]
                          for s in finished)
    val_metrics = _union(run.validation() for run in runs)
    # Each optimized model with the measure its reports give (accuracy, or rmse for regression)
    # and the split it was measured on.
    models = {m: "/".join(_union([row.get("measure", "accuracy") for row in run.optimized
                                  if row["model"] == m] for run in runs))
              for m in _union([row["model"] for row in run.optimized] for run in runs)}
    model_splits = {m: "/".join(_union([row["split"] for row in run.optimized
                                        if row["model"] == m and row.get("split")]
                                       for run in runs)) for m in models}
    header = (["run", "epochs"] + [f"{eval_name} {m}" for m in eval_metrics]
              + [f"val {m}" for m in val_metrics] + ["steps/s", "strategy", "precision"]
              + [f"{m}{f' ({model_splits[m]})' if model_splits[m] else ''}: {measure}, gzip KiB"
                 for m, measure in models.items()])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, run in zip(labels(runs), runs):
        s = run.summary or {}
        evaluation, validation = s.get("eval", {}), run.validation()
        seconds = s.get("seconds_per_step")
        strategy = MISSING
        if run.summary:
            strategy = f"{s.get('strategy', '?')} x{s.get('num_replicas', '?')}"
            if (s.get("num_workers") or 1) > 1:
                strategy += f" ({s['num_workers']} workers)"
        optimized = {row["model"]: row for row in run.optimized}
        cells = ([label if run.summary else f"{label} (unfinished)",
                  str(s.get("epochs", len(run.history)))]
                 + [_number(evaluation.get(m)) for m in eval_metrics]
                 + [_number(validation.get(m)) for m in val_metrics]
                 + [_number(1 / seconds if seconds else None, 1), strategy,
                    s.get("mixed_precision", MISSING)]
                 + [_optimized_cell(optimized[m]) if m in optimized else MISSING
                    for m in models])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _optimized_cell(row: dict) -> str:
    """`0.9123, 41.2`: an optimized model's measure and gzip KiB (`-` when not measured: the
    float row of a model measured as Keras, without a .tflite)."""
    gzip = row.get("gzip_bytes")
    return (f"{_number(row.get(row.get('measure', 'accuracy')))}, "
            f"{MISSING if gzip is None else f'{gzip / 1024:.1f}'}")


def validation_panels(runs: list[Run]) -> list[curves.Panel]:
    """One subplot per validation metric, one line per run that recorded it."""
    metrics = _union([m for m in curves.metric_names(run.history)
                      if any(f"val_{m}" in e for e in run.history)] for run in runs)
    return [curves.Panel(f"validation {metric}",
                         [curves.Line(label, *curves.series(run.history, f"val_{metric}"))
                          for label, run in zip(labels(runs), runs)
                          if any(f"val_{metric}" in e for e in run.history)])
            for metric in metrics]


def report(paths: list[str], output: str = DEFAULT_OUTPUT) -> str:
    """Compares the runs in `paths`: returns the table and what was written, and writes the
    validation curves to `output` (a PNG; gs:// works)."""
    runs = [load_run(path) for path in paths]
    text = [table(runs), ""]
    without = [label for label, run in zip(labels(runs), runs) if not run.history]
    if without:
        text.append(f"no {run_dir_lib.CURVES_JSON} (no epoch recorded yet, or trained by a tftrain "
                    f"that did not write one): {', '.join(without)}")
    plots = validation_panels(runs)
    if not plots:
        text.append(f"no validation curves to draw: {output} not written")
        return "\n".join(text)
    parent = posixpath.dirname(output)
    if parent:
        tf.io.gfile.makedirs(parent)
    write_atomic(output, curves.render_png(plots))
    text.append(f"validation curves of {len(runs)} run(s): {output}")
    return "\n".join(text)

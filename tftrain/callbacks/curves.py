"""`curves.png` in the run directory: loss, metrics and learning rate per epoch.

The picture is redrawn at an epoch end once REDRAW_SECONDS have passed since it was last drawn
(drawing costs ~0.5-1 s of CPU, as much as a whole epoch of a small model), and always when
training ends; `curves.json` is rewritten at every epoch end.

One subplot per metric the epoch logs have (train and `val_` on the same axes), plus one for the
learning rate. The history behind the picture is kept in `curves.json` beside it, so a resumed
run draws every epoch, including those of the attempts before the restart.

Why `curves.json` rather than reading the TensorBoard event files back: the TensorBoard writers
buffer their events (flushed every 2 minutes or 10 events), so a run killed with SIGKILL loses
its latest epochs from them, while `curves.json` is written atomically at each epoch end; and
one small JSON file reads the same on gs:// without scanning and decoding event protos.
"""
from __future__ import annotations

import dataclasses
import io
import json
import math
import posixpath
import time

import tensorflow as tf
import tf_keras as keras

from tftrain.errors import DataError
from tftrain.fileio import join, read_json, write_atomic, write_json
from tftrain.run_dir import CURVES_JSON, CURVES_PNG  # noqa: F401  (the run dir's names)

LEARNING_RATE_KEYS = ("learning_rate", "lr")  # LearningRateLogger's; ReduceLROnPlateau's
TRAIN_COLOR, VALIDATION_COLOR = "#1f77b4", "#ff7f0e"
PANEL_INCHES = (4.8, 3.4)
DPI = 100
MAX_COLUMNS = 3
# Fixed margins in inches (left, right, top, bottom), with room for tick labels, the titles and
# the x label: the layout engines measure every text first, which doubles the drawing time.
MARGIN_INCHES = (0.65, 0.15, 0.6, 0.5)
REDRAW_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class Line:
    """One curve: values by epoch number (1-based); `color` None takes the next default color."""

    label: str
    epochs: list[int]
    values: list[float]
    color: str | None = None


@dataclasses.dataclass(frozen=True)
class Panel:
    """One subplot: a title (what the y axis measures) and its curves."""

    title: str
    lines: list[Line]


def read_history(run_dir: str) -> list[dict]:
    """The epochs recorded in `run_dir/curves.json` ([] when there is none), each a dict of
    `epoch` (1-based) and the epoch's logs."""
    path = join(run_dir, CURVES_JSON)
    if not tf.io.gfile.exists(path):
        return []
    try:
        return list(read_json(path)["epochs"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise DataError(f"{path} is not a curves file tftrain wrote ({e}); move it away") from None


def metric_names(history: list[dict]) -> list[str]:
    """The metrics in `history` without their `val_` prefix, loss first, then in log order."""
    names: dict[str, None] = {}
    for entry in history:
        for key in entry:
            if key != "epoch" and key not in LEARNING_RATE_KEYS:
                names[key.removeprefix("val_")] = None
    return sorted(names, key=lambda name: name != "loss")  # stable: the rest keep their order


def series(history: list[dict], key: str) -> tuple[list[int], list[float]]:
    """The epochs that logged `key`, and its values."""
    points = [(e["epoch"], float(e[key])) for e in history if key in e]
    return [p[0] for p in points], [p[1] for p in points]


def panels(history: list[dict]) -> list[Panel]:
    """The subplots of curves.png: one per metric (train and validation), then the learning rate."""
    result = []
    for name in metric_names(history):
        lines = [Line(label, *series(history, key), color)
                 for label, key, color in (("train", name, TRAIN_COLOR),
                                           ("validation", f"val_{name}", VALIDATION_COLOR))]
        result.append(Panel(name, [line for line in lines if line.epochs]))
    lr_key = next((k for k in LEARNING_RATE_KEYS if any(k in e for e in history)), None)
    if lr_key:
        result.append(Panel("learning rate",
                            [Line("learning rate", *series(history, lr_key), TRAIN_COLOR)]))
    return result


def grid(num_panels: int) -> tuple[int, int]:
    """(rows, columns) of the subplots: at most MAX_COLUMNS side by side."""
    columns = max(1, min(num_panels, MAX_COLUMNS))
    return max(1, math.ceil(num_panels / columns)), columns


def image_size(num_panels: int) -> tuple[int, int]:
    """(width, height) in pixels of a picture of `num_panels` subplots."""
    rows, columns = grid(num_panels)
    return round(columns * PANEL_INCHES[0] * DPI), round(rows * PANEL_INCHES[1] * DPI)


def figure(plots: list[Panel], title: str = ""):
    """A matplotlib Figure (Agg canvas, no pyplot global state) of `plots`, `image_size` big."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    rows, columns = grid(len(plots))
    width, height = (pixels / DPI for pixels in image_size(len(plots)))
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    left, right, top, bottom = MARGIN_INCHES
    fig.subplots_adjust(left=left / width, right=1 - right / width, top=1 - top / height,
                        bottom=bottom / height, wspace=0.3, hspace=0.45)
    for index, panel in enumerate(plots):
        ax = fig.add_subplot(rows, columns, index + 1)
        for line in panel.lines:
            ax.plot(line.epochs, line.values, label=line.label, color=line.color, marker="o",
                    markersize=3, linewidth=1.8)
        ax.set_title(panel.title)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        if len(panel.lines) > 1:
            ax.legend(fontsize="small")
    if title:
        fig.suptitle(title, y=1 - 0.12 / height, va="top")
    return fig


def render_png(plots: list[Panel], title: str = "") -> bytes:
    """`plots` drawn as PNG bytes (see `figure`)."""
    buffer = io.BytesIO()
    figure(plots, title).savefig(buffer, format="png")
    return buffer.getvalue()


class Curves(keras.callbacks.Callback):
    """Rewrites `run_dir/curves.json` at each epoch end, and redraws `run_dir/curves.png` from it
    at an epoch end at most every REDRAW_SECONDS and when training ends.

    Put it after `LearningRateLogger`, so the logs it sees hold the learning rate. On the first
    epoch of a resumed run it reads the earlier epochs back from curves.json (dropping the epoch
    being rerun and any later one, recorded before a kill but not backed up).

    Args:
        run_dir: the run directory (local, gs://, ...) the two files are written into.
        chief: whether this process writes the run's files; the other workers of a multi-worker
            run pass False and the callback does nothing.
    """

    def __init__(self, run_dir: str, chief: bool = True):
        super().__init__()
        self.run_dir = run_dir
        self.chief = chief
        self.history: list[dict] = []
        self._loaded = False
        self._drawn_at = 0.0
        self._drawn = False  # whether curves.png shows self.history

    def on_train_begin(self, logs=None):
        self._drawn_at = time.monotonic()  # as if drawn now: a short run draws once, at its end

    def on_epoch_begin(self, epoch, logs=None):
        if self.chief and not self._loaded:
            self.history = [e for e in read_history(self.run_dir) if e["epoch"] <= epoch]
            self._loaded = True

    def on_epoch_end(self, epoch, logs=None):
        if not self.chief:
            return
        entry = {"epoch": epoch + 1}
        for key, value in (logs or {}).items():
            try:
                entry[key] = float(value)
            except (TypeError, ValueError):
                pass  # not a scalar metric
        self.history = [e for e in self.history if e["epoch"] < epoch + 1] + [entry]
        write_json(join(self.run_dir, CURVES_JSON), {"epochs": self.history})
        self._drawn = False
        if time.monotonic() - self._drawn_at >= REDRAW_SECONDS:
            self._draw()

    def on_train_end(self, logs=None):
        if self.chief and self.history and not self._drawn:
            self._draw()

    def _draw(self) -> None:
        title = posixpath.basename(self.run_dir.rstrip("/"))
        write_atomic(join(self.run_dir, CURVES_PNG), render_png(panels(self.history), title))
        self._drawn_at, self._drawn = time.monotonic(), True

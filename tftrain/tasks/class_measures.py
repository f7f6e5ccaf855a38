"""Per-class measures of a classifier: a confusion matrix added to batch by batch, and its picture.

`ConfusionMatrix` holds counts only (classes x classes, rows the true class, columns the
predicted one, in class-id order), so measuring a split takes memory flat in its size. From it,
`measures` gives what `summary.json["eval"]` and `tftrain evaluate`'s JSON carry:
`per_class` {class name: {precision, recall, f1, support}}, `macro_f1`, `confusion_matrix` and
`class_names` (the matrix's order: JSON files list `per_class` by sorted name), with
scikit-learn's definitions (`precision_recall_fscore_support`, zero_division=0: a class never
predicted has precision 0; macro-F1 is the mean F1 over the classes that occur in the labels or
the predictions, as `f1_score(average="macro")` without `labels=`). `table` is the text
`tftrain evaluate` prints; `render_png` the `confusion.png` beside the JSON.
"""
from __future__ import annotations

import io

import numpy as np

MAX_CLASSES = 1000  # beyond this, no matrix (1000 x 1000 counts: 8 MB): per-class measures skipped
ANNOTATED_CLASSES = 20  # counts written in the cells up to this many classes
MAX_TICK_LABELS = 50  # class names on the axes: every k-th beyond this many classes


class ConfusionMatrix:
    """Counts of (true class, predicted class) over the batches `add`ed.

    Args:
        num_classes: the classes; 0 or None: taken from the first batch's outputs (their width,
            2 for a single sigmoid unit; over MAX_CLASSES, nothing is counted and `measures` is
            empty).
        classify: the task's class ids of a batch of outputs
            (`tasks.classification.predicted_classes`).
    """

    def __init__(self, num_classes: int | None, classify):
        self.counts = np.zeros((num_classes, num_classes), np.int64) if num_classes else None
        self.classify = classify

    def add(self, outputs, labels) -> None:
        """Counts a batch: `outputs` the model's scores (one row per example), `labels` the
        integer class ids."""
        outputs = np.asarray(outputs)
        if self.counts is None:
            width = max(2, outputs.reshape(len(outputs), -1).shape[-1])
            self.counts = np.zeros((width,) * 2 if width <= MAX_CLASSES else (0, 0), np.int64)
        if not self.counts.size:
            return
        truth = np.asarray(labels).reshape(-1).astype(np.int64)
        predicted = np.asarray(self.classify(outputs)).reshape(-1)
        size = len(self.counts)
        valid = (truth >= 0) & (truth < size) & (predicted >= 0) & (predicted < size)
        np.add.at(self.counts, (truth[valid], predicted[valid]), 1)

    def measures(self, class_names=None) -> dict:
        """`per_class`, `macro_f1`, `confusion_matrix` and `class_names` (see the module
        docstring); the names are `class_names` when they name every class once, else the
        class ids. Empty when nothing could be counted (too many classes)."""
        if self.counts is None or not self.counts.size:  # nothing counted, or too many classes
            return {}
        counts = self.counts
        precision, recall, f1, support = _rates(counts)
        present = (counts.sum(axis=0) + support) > 0
        names = labels_of(class_names, len(counts))
        return {"per_class": {name: {"precision": float(p), "recall": float(r), "f1": float(f),
                                     "support": int(s)}
                              for name, p, r, f, s in zip(names, precision, recall, f1, support)},
                "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
                "confusion_matrix": counts.tolist(), "class_names": names}


def _rates(counts: np.ndarray):
    """Per class: precision, recall, F1 (0 where undefined) and support."""
    hits = np.diag(counts).astype(np.float64)
    predicted, support = counts.sum(axis=0), counts.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(predicted > 0, hits / np.maximum(predicted, 1), 0.0)
        recall = np.where(support > 0, hits / np.maximum(support, 1), 0.0)
        both = precision + recall
        f1 = np.where(both > 0, 2 * precision * recall / np.where(both > 0, both, 1.0), 0.0)
    return precision, recall, f1, support


def labels_of(class_names, num_classes: int) -> list[str]:
    """The names of classes 0..`num_classes`-1: `class_names` when it names each once, else
    the ids as strings."""
    names = [str(name) for name in class_names or []]
    if len(names) == num_classes and len(set(names)) == num_classes:
        return names
    return [str(i) for i in range(num_classes)]


def table(measures: dict) -> str:
    """One line per class (precision, recall, F1, support) and a `macro` line (the means over
    the classes present, the total support), as `tftrain evaluate` prints them."""
    rows = measures["per_class"]
    width = max([len("class"), len("macro")] + [len(name) for name in rows])
    lines = [f"{'class':<{width}}  precision  recall      f1  support"]
    for name, row in rows.items():
        lines.append(f"{name:<{width}}  {row['precision']:9.4f}  {row['recall']:6.4f}  "
                     f"{row['f1']:6.4f}  {row['support']:7d}")
    matrix = np.asarray(measures["confusion_matrix"], np.int64).reshape(len(rows), len(rows))
    precision, recall, _, support = _rates(matrix)
    present = (matrix.sum(axis=0) + support) > 0
    mean = (lambda values: float(values[present].mean()) if present.any() else 0.0)
    lines.append(f"{'macro':<{width}}  {mean(precision):9.4f}  {mean(recall):6.4f}  "
                 f"{measures['macro_f1']:6.4f}  {int(support.sum()):7d}")
    return "\n".join(lines)


def render_png(measures: dict, title: str = "") -> bytes:
    """The confusion matrix as a PNG: rows the true class, columns the predicted one, class
    names on both axes (every k-th beyond MAX_TICK_LABELS classes, cut to 20 characters), each
    cell shaded by its share of the true class's examples (readable however imbalanced the
    classes), with its count written in it up to ANNOTATED_CLASSES classes (beyond, a color bar
    reads the shades). Fixed margins, no layout engine: drawing costs ~0.1 s of CPU."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(measures["per_class"])
    size = len(names)
    matrix = np.asarray(measures["confusion_matrix"], np.int64).reshape(size, size)
    shares = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    annotated = size <= ANNOTATED_CLASSES
    label = 0.1 + 0.075 * min(max([len(name) for name in names] + [1]), 20)  # inches
    side = min(12.0, 2.5 + 0.3 * min(size, 40))  # the matrix, inches
    left, bottom, top, right = label + 0.55, label + 0.45, 0.45, 0.2 if annotated else 1.1
    width, height = left + side + right, bottom + side + top
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((left / width, bottom / height, side / width, side / height))
    image = ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest",
                      aspect="auto")
    if not annotated:
        bar = fig.add_axes(((left + side + 0.15) / width, bottom / height, 0.15 / width,
                            side / height))
        fig.colorbar(image, cax=bar, label="share of the true class")
    step = max(1, -(-size // MAX_TICK_LABELS))
    ticks = list(range(0, size, step))
    shown = [names[i][:20] for i in ticks]
    ax.set_xticks(ticks, shown, rotation=90 if label > 0.4 or size > 10 else 0)
    ax.set_yticks(ticks, shown)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    if annotated:
        for i, j in zip(*np.nonzero(matrix)):
            ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=8,
                    color="white" if shares[i, j] > 0.5 else "black")
    ax.set_title(f"{title + ': ' if title else ''}macro-F1 {measures['macro_f1']:.4f}",
                 fontsize=10)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": PNG_SOFTWARE})
    return buffer.getvalue()


PNG_SOFTWARE = "tftrain confusion matrix"  # in the PNG's text chunk: what `written_here` finds


def written_here(content: bytes) -> bool:
    """Whether PNG bytes are a picture `render_png` drew (its Software text chunk)."""
    return content[:8] == b"\x89PNG\r\n\x1a\n" and PNG_SOFTWARE.encode() in content[:4096]

"""Finding a pipeline's source files, and the source splits their names carry.

A source is one file, a glob pattern, or a directory. In a directory, files named after a split
(`train.csv`, `validation-00001.jsonl`, `test_part2.jsonl`, `val.csv`) keep that split.
All paths go through `tf.io.gfile`, so gs:// sources work.
"""
from __future__ import annotations

import posixpath
import re

from tftrain.errors import ConfigError

SPLIT_NAMES = {"train": "train", "validation": "validation", "val": "validation",
               "valid": "validation", "dev": "validation", "test": "test"}
_SPLIT_PREFIX = re.compile(r"^(train|validation|valid|val|dev|test)(?:$|[-_.])", re.IGNORECASE)


def split_from_name(name: str) -> str | None:
    """The split a file or folder name stands for ('train', 'validation', 'test'), else None."""
    stem = posixpath.basename(name.rstrip("/")).split(".", 1)[0]
    match = _SPLIT_PREFIX.match(stem)
    return SPLIT_NAMES[match.group(1).lower()] if match else None


def list_files(source: str, extensions: tuple[str, ...], what: str) -> list[str]:
    """Sorted paths of the source's files with one of `extensions` (lowercase, with the dot).

    Raises ConfigError naming `source` when nothing matches.
    """
    import tensorflow as tf

    if tf.io.gfile.isdir(source):
        paths = [posixpath.join(source, name) for name in tf.io.gfile.listdir(source)]
    elif any(c in source for c in "*?["):
        paths = tf.io.gfile.glob(source)
    elif tf.io.gfile.exists(source):
        return [source]
    else:
        raise ConfigError(f"input {source!r} does not exist; pass the {what} file, a directory of "
                          f"them, or a glob pattern.")
    paths = sorted(p for p in paths if p.lower().endswith(extensions)
                   and not posixpath.basename(p).startswith(".") and not tf.io.gfile.isdir(p))
    if not paths:
        raise ConfigError(f"no {what} files ({', '.join(extensions)}) found at {source!r}.")
    return paths


def source_splits(paths: list[str]) -> dict[str, str | None]:
    """Maps each path to its split when every file names one; otherwise every split is None.

    All-or-nothing, so a directory with `train.csv` and `extra.csv` is not half split.
    """
    splits = {path: split_from_name(path) for path in paths}
    if len(paths) > 1 and all(splits.values()):
        return splits
    return {path: None for path in paths}



_UNDECODABLE = re.compile("[\udc80-\udcff]")


def text_lines(path: str):
    """The lines of the text file `path` (`-`: standard input; line ends kept), decoded as UTF-8
    one line at a time: bytes that are not UTF-8 become lone surrogates (`undecodable` finds
    them), so one bad line is a bad row instead of the end of the file."""
    import sys

    import tensorflow as tf

    if path == STDIN:
        for line in sys.stdin.buffer:
            yield line.decode("utf-8", "surrogateescape")
        return
    # A local file through Python's own reader: it also reads a named pipe (gfile's does not).
    with (open(path, "rb") if "://" not in path else tf.io.gfile.GFile(path, "rb")) as f:
        for line in f:
            yield line.decode("utf-8", "surrogateescape")


STDIN = "-"
# What a file holds, by its extension: the kinds `predict_files` names in its refusals.
KINDS = {".csv": "CSV files", ".tsv": "CSV files", ".jsonl": "JSON Lines files",
         ".ndjson": "JSON Lines files", ".txt": "text files", ".jpg": "images", ".jpeg": "images",
         ".png": "images", ".tfrecord": "TFRecords", ".npy": "NumPy arrays",
         ".npz": "NumPy arrays"}


def predict_files(source: str, extensions: tuple[str, ...], what: str, pipeline: str,
                  stdin: bool = False) -> list[str]:
    """The files `tftrain predict` reads from `source`, in order: the file itself, a folder's
    files (recursively, sorted by path) or a glob's matches with one of `extensions`; `-`
    (standard input) when the pipeline reads lines (`stdin`). Raises ConfigError naming what
    `source` holds when it holds none of `what` (the kind the model's `pipeline` reads)."""
    import tensorflow as tf

    wanted = f"{what} ({', '.join(extensions)})"
    if source == STDIN:
        if stdin:
            return [STDIN]
        raise ConfigError(f"--input=- (lines on standard input) is not an input of pipeline "
                          f"{pipeline!r}, which reads {wanted}: pass a file, a folder or a glob")
    if tf.io.gfile.isdir(source):
        found = sorted(posixpath.join(folder, name) for folder, _, names in tf.io.gfile.walk(source)
                       for name in names if not name.startswith("."))
    elif any(c in source for c in "*?["):
        found = sorted(p for p in tf.io.gfile.glob(source) if not tf.io.gfile.isdir(p))
    elif tf.io.gfile.exists(source):
        found = [source]
    else:
        raise ConfigError(f"--input={source!r} does not exist; pass {wanted}: a file, a folder "
                          "or a glob pattern")
    paths = [p for p in found if p.lower().endswith(extensions)]
    if not paths:
        kinds = sorted({KINDS.get(posixpath.splitext(p)[1].lower(),
                                  f"{posixpath.splitext(p)[1] or 'extensionless'} files")
                        for p in found})
        holds = " and ".join(kinds) if kinds else "no files"
        raise ConfigError(f"--input={source!r} holds {holds}, but the model's dataset (pipeline "
                          f"{pipeline!r}) is of {wanted}: give the model {what}, or predict "
                          "with a model trained on that kind of data")
    return paths


def undecodable(text: str) -> bool:
    """True when `text` (from `text_lines`) holds bytes that were not UTF-8."""
    return bool(_UNDECODABLE.search(text))

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
    """The lines of the text file `path` (line ends kept), decoded as UTF-8 one line at a time:
    bytes that are not UTF-8 become lone surrogates (`undecodable` finds them), so one bad line
    is a bad row instead of the end of the file."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as f:
        for line in f:
            yield line.decode("utf-8", "surrogateescape")


def undecodable(text: str) -> bool:
    """True when `text` (from `text_lines`) holds bytes that were not UTF-8."""
    return bool(_UNDECODABLE.search(text))

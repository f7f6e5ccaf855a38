"""`dataset.json`: what a TFRecord dataset holds. Written last; a directory without it is not a dataset.

Layout:
    {"format": "tftrain.dataset/1", "pipeline": "digits", "source": "...", "tool_version": "...",
     "features": {name: {"dtype": ..., "shape": [...]}}, "info": {...pipeline metadata...},
     "splits": {"train": {"num_examples": N, "shards": [
         {"file": "train-00000-of-00002.tfrecord", "num_examples": n, "bytes": b, "sha256": h}]}},
     "bad_rows": {"count": k, "file": "bad_rows.jsonl"},
     "assets": [{"file": "tokenizer.model", "bytes": b, "sha256": h}]}   (when a pipeline has any)

Assets are files a pipeline keeps beside the shards (a SentencePiece model): named in
`ASSET_NAMES` only, and read back through `read_asset`, which checks their size and hash.

Versions: `format` names the format's version (`tftrain.dataset/<VERSION>`; a `version` field,
which other tools write, counts too). Within a version fields are only ever added, never changed
in meaning: a manifest of this version with fields this tftrain does not know is read, with a
warning naming them. A manifest of a newer version is refused, naming both versions and the
upgrade (`check_version`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re

import tensorflow as tf

from absl import logging

import tftrain
from tftrain.data.record_file import FRAME_BYTES
from tftrain.errors import DataError
from tftrain.fileio import (is_local, is_regular_file, join, read_bytes, read_json,
                            resolves_inside, write_json)

MANIFEST_NAME = "dataset.json"
BAD_ROWS_NAME = "bad_rows.jsonl"
TOKENIZER_MODEL = "tokenizer.model"
ASSET_NAMES = (TOKENIZER_MODEL,)  # the only names a dataset's assets may have
FORMAT_NAME = "tftrain.dataset"
VERSION = 1  # the format version this tftrain writes, and the newest it reads
FORMAT = f"{FORMAT_NAME}/{VERSION}"
# The top-level fields of format version 1 (`write`, `writer.write_dataset`, `append.appended`).
FIELDS = frozenset({"format", "version", "pipeline", "source", "tool_version", "features", "info",
                    "splits", "bad_rows", "label_key", "workers", "seed", "assets", "stats",
                    "appends"})


def shard_name(split: str, index: int, num_shards: int, generation: int = 0) -> str:
    """The file name of shard `index` of `num_shards` of `split`; the shards of the
    `generation`-th `tftrain convert --append` carry it in their name (`train-g001-00000-...`)."""
    part = f"-g{generation:03d}" if generation else ""
    return f"{split}{part}-{index:05d}-of-{num_shards:05d}.tfrecord"


def exists(data_dir: str) -> bool:
    """True when `data_dir` holds a complete dataset (its manifest was written)."""
    return tf.io.gfile.exists(join(data_dir, MANIFEST_NAME))


def read(data_dir: str) -> dict:
    """Reads `data_dir/dataset.json` and checks all of it (`validate`); raises DataError naming
    every problem, one line each."""
    path = join(data_dir, MANIFEST_NAME)
    if not tf.io.gfile.exists(path):
        raise DataError(
            f"{data_dir} is not a tftrain dataset: {MANIFEST_NAME} is missing (a conversion that did "
            "not finish leaves none). Run `tftrain convert --output=" + data_dir + " ...` to create it.")
    if is_local(path) and not resolves_inside(path, data_dir):
        raise DataError(f"{path} leads out of {data_dir} (to {os.path.realpath(path)}): tftrain "
                        "reads a dataset's manifest only from inside it; convert the dataset again.")
    try:
        manifest = read_json(path, MAX_MANIFEST_BYTES)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError included
        raise DataError(f"{path} is not a valid manifest ({e}); convert the dataset again.") from None
    validate(manifest, path)
    return manifest


# ---- the typed view, and the one place that checks a manifest --------------------------------

MAX_MANIFEST_BYTES = 256 << 20
DTYPES = ("string", "int64", "float32")
MAX_CLASSES = 10_000_000  # a head of 10M classes over 128 features is 5 GB of float32 weights
_PLAIN_NAME = re.compile(r"[^/\\\x00]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclasses.dataclass(frozen=True)
class Shard:
    """One shard file. Other tools' TFRecords (`data.format=tfrecord`) know only the file."""

    file: str
    num_examples: int | None = None
    bytes: int | None = None
    sha256: str | None = None


@dataclasses.dataclass(frozen=True)
class Split:
    """A split's shards; `num_examples` is None for other tools' TFRecords that were not
    counted."""

    num_examples: int | None
    shards: tuple[Shard, ...]

    @property
    def bytes(self) -> int:
        """The bytes of its shards, as far as the manifest records them (0 if unknown)."""
        return sum(shard.bytes or 0 for shard in self.shards)


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A dataset's manifest, typed: what the engine, `check`, `doctor` and `optimize` read."""

    pipeline: str
    features: dict
    info: dict
    splits: dict[str, Split]

    def examples(self, split: str) -> int:
        """The number of examples of `split`; DataError when the split is unknown or uncounted."""
        if split not in self.splits or self.splits[split].num_examples is None:
            raise DataError(f"the dataset has no counted split {split!r}; it has: "
                            f"{', '.join(sorted(self.splits)) or 'none'}.")
        return self.splits[split].num_examples


def typed(manifest: dict) -> Manifest:
    """The typed view of a manifest `read` checked, or of `foreign.describe`'s description of
    other tools' TFRecords (which know less: see `Shard`)."""
    def shard(entry: dict) -> Shard:
        return Shard(entry["file"], entry.get("num_examples"), entry.get("bytes"),
                     entry.get("sha256"))

    splits = {name: Split(entry.get("num_examples"),
                          tuple(shard(s) for s in entry.get("shards", ())))
              for name, entry in manifest.get("splits", {}).items()}
    return Manifest(manifest.get("pipeline", ""), manifest.get("features") or {},
                    manifest.get("info") or {}, splits)


def validate(manifest, path: str = MANIFEST_NAME) -> Manifest:
    """Checks a parsed manifest (types, ranges, names, counts against sizes) and returns its
    typed view; raises DataError listing every problem, one line each, by its JSON path."""
    problems: list[str] = []

    def problem(where: str, what: str) -> None:
        problems.append(f"{where}: {what}")

    if not isinstance(manifest, dict):
        raise DataError(f"{path} is not a tftrain manifest: it holds a {type(manifest).__name__}, "
                        "not an object; convert the dataset again.")
    check_version(manifest, path)
    pipeline = manifest.get("pipeline")
    if not isinstance(pipeline, str) or not pipeline:
        problem("pipeline", f"{pipeline!r} is not a pipeline name")
    features = _mapping(manifest, "features", problem)
    for name, feature in features.items():
        _check_feature(f"features.{name}", feature, problem)
    info = _mapping(manifest, "info", problem, required=False)
    for key, (valid, what) in _INFO_RULES.items():
        if key in info and not valid(info[key]):
            problem(f"info.{key}", f"{_short(info[key])} is not {what}")
    splits = {}
    for name, entry in _mapping(manifest, "splits", problem).items():
        splits[name] = _check_split(f"splits.{name}", entry, problem)
    if not splits and "splits" in manifest:
        problem("splits", "no split")
    _check_assets(manifest.get("assets", []), problem)
    bad_rows = _mapping(manifest, "bad_rows", problem, required=False)
    if bad_rows and not _count(bad_rows.get("count")):
        problem("bad_rows.count", f"{bad_rows.get('count')!r} is not a non-negative integer")
    if problems:
        more = [f"\n  {path}: {line}" for line in problems[1:20]]
        if len(problems) > 20:
            more.append(f"\n  ... and {len(problems) - 20} more")
        raise DataError(f"{path} is not a valid tftrain manifest (convert the dataset again): "
                        f"{problems[0]}" + "".join(more))
    return Manifest(pipeline, features, info, splits)


def check_version(manifest: dict, path: str) -> None:
    """Raises DataError for a manifest of another format or of a newer version than `VERSION`;
    warns (once per path) about the fields of this version that this tftrain does not know."""
    name, _, number = str(manifest.get("format")).rpartition("/")
    if name != FORMAT_NAME or not _VERSION.fullmatch(number):
        raise DataError(f"{path} has format {manifest.get('format')!r}, expected {FORMAT!r}: it "
                        "is not a tftrain dataset manifest; convert the dataset again.")
    claimed = manifest.get("version", VERSION)
    if not _VERSION.fullmatch(str(claimed)) or isinstance(claimed, bool):
        raise DataError(f"{path}: version {_short(claimed)} is not a format version (a positive "
                        "integer); convert the dataset again.")
    version = max(int(number), int(claimed))
    if version > VERSION:
        written_by = manifest.get("tool_version")
        by = f" (written by tftrain {written_by})" if isinstance(written_by, str) else ""
        raise DataError(f"{path} is dataset format version {version}{by}, newer than this "
                        f"tftrain {tftrain.__version__} reads (version {VERSION}): upgrade "
                        "tftrain (pip install --upgrade tftrain), or convert the data again "
                        "with this one.")
    unknown = sorted(set(manifest) - FIELDS)
    if unknown and path not in _WARNED:
        _WARNED.add(path)
        logging.warning("%s has field(s) that this tftrain %s does not know: %s; read as "
                        "dataset format version %d, which they do not change (a later tftrain "
                        "adds fields only within a version)", path, tftrain.__version__,
                        ", ".join(_short(name) for name in unknown[:10]), VERSION)


_VERSION = re.compile(r"[1-9][0-9]{0,8}")
_WARNED: set[str] = set()  # manifests already warned about (a run reads its manifest often)


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


# The info keys that tftrain's engine and several pipelines read (each pipeline's own keys are
# its business): what each must be.
_INFO_RULES = {
    "num_classes": (lambda v: _count(v, minimum=1) and v <= MAX_CLASSES,
                    f"a positive integer up to {MAX_CLASSES:,}"),
    "class_names": (_strings, "a list of strings"),
    "vocabulary": (_strings, "a list of strings"),
    "image_size": (lambda v: isinstance(v, list) and len(v) == 3
                   and all(_count(n, minimum=1) for n in v), "[height, width, channels]"),
    "vocab_size": (lambda v: _count(v, minimum=1), "a positive integer"),
    "sequence_length": (lambda v: _count(v, minimum=1), "a positive integer"),
    "max_length": (lambda v: _count(v, minimum=1), "a positive integer"),
    "input_dim": (lambda v: _count(v, minimum=1), "a positive integer"),
    "label_stats": (lambda v: isinstance(v, dict), "an object"),
    "image_encoding": (lambda v: isinstance(v, str), "a string"),
    "max_pixels": (lambda v: _count(v, minimum=1), "a positive integer"),
}


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _count(value, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _matches(value, dtype) -> bool:
    """True when `value` is a valid default of a feature of `dtype`."""
    if dtype == "string":
        return isinstance(value, str)
    if dtype == "int64":
        return isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 3.4e38


def _mapping(parent: dict, key: str, problem, required: bool = True) -> dict:
    value = parent.get(key)
    if key not in parent and not required:
        return {}
    if not isinstance(value, dict):
        problem(key, "missing" if value is None else f"a {type(value).__name__}, not an object")
        return {}
    return value


def _check_feature(where: str, feature, problem) -> None:
    if not isinstance(feature, dict):
        problem(where, f"a {type(feature).__name__}, not an object")
        return
    if feature.get("dtype") not in DTYPES:
        problem(f"{where}.dtype", f"{feature.get('dtype')!r} is not one of {', '.join(DTYPES)}")
    if "default" in feature and not _matches(feature["default"], feature.get("dtype")):
        problem(f"{where}.default", f"{feature['default']!r} is not a {feature.get('dtype')}")
    shape = feature.get("shape")
    if not isinstance(shape, list) or not all(_count(n) for n in shape) or len(shape) > 8:
        problem(f"{where}.shape", f"{shape!r} is not a list of non-negative integers")


def _check_split(where: str, entry, problem) -> Split:
    if not isinstance(entry, dict):
        problem(where, f"a {type(entry).__name__}, not an object")
        return Split(0, ())
    num_examples, shards = entry.get("num_examples"), entry.get("shards")
    if not _count(num_examples):
        problem(f"{where}.num_examples", f"{num_examples!r} is not a non-negative integer")
    if not isinstance(shards, list) or not shards:
        problem(f"{where}.shards", "missing or empty: a split has at least one shard")
        return Split(0, ())
    counts = entry.get("label_counts", {})
    if not (isinstance(counts, dict) and all(_count(n) for n in counts.values())):
        problem(f"{where}.label_counts", "not an object of non-negative integer counts")
    checked = tuple(_check_shard(f"{where}.shards[{i}]", shard, problem)
                    for i, shard in enumerate(shards))
    total = sum(shard.num_examples for shard in checked)
    if _count(num_examples) and total != num_examples:
        problem(f"{where}.num_examples", f"{num_examples:,}, but its shards hold {total:,}")
    return Split(num_examples if _count(num_examples) else 0, checked)


def _check_shard(where: str, shard, problem) -> Shard:
    if not isinstance(shard, dict):
        problem(where, f"a {type(shard).__name__}, not an object")
        return Shard("", 0, None, None)
    file, count = shard.get("file"), shard.get("num_examples")
    size, sha256 = shard.get("bytes"), shard.get("sha256")
    if not isinstance(file, str) or not _PLAIN_NAME.fullmatch(file) or file in (".", ".."):
        problem(f"{where}.file", f"{file!r} is not a file name inside the dataset directory")
    if not _count(count):
        problem(f"{where}.num_examples", f"{count!r} is not a non-negative integer")
        count = 0
    if not _count(size):
        problem(f"{where}.bytes", f"{size!r} is not a non-negative integer")
    elif count * FRAME_BYTES > size:
        problem(f"{where}.num_examples", f"{count:,} records cannot fit in {size:,} bytes (each "
                f"takes at least {FRAME_BYTES})")
    if not (isinstance(sha256, str) and _SHA256.fullmatch(sha256)):
        problem(f"{where}.sha256", f"{sha256!r} is not a sha256 in hex")
    return Shard(file if isinstance(file, str) else "", count, size if _count(size) else 0,
                 sha256 if isinstance(sha256, str) else "")


def _check_assets(assets, problem) -> None:
    if not isinstance(assets, list):
        problem("assets", f"a {type(assets).__name__}, not a list")
        return
    for i, entry in enumerate(assets):
        where = f"assets[{i}]"
        if not isinstance(entry, dict) or entry.get("file") not in ASSET_NAMES:
            problem(where, f"{_short(entry)} is not an asset named {' or '.join(ASSET_NAMES)}")
        elif not _count(entry.get("bytes")) or not (
                isinstance(entry.get("sha256"), str) and _SHA256.fullmatch(entry["sha256"])):
            problem(where, "needs a byte count and a sha256 in hex")


def asset_entry(name: str, content: bytes) -> dict:
    """The manifest's entry of asset `name` holding `content`."""
    return {"file": name, "bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}


def read_asset(data_dir: str, manifest: dict, name: str) -> bytes:
    """The bytes of the dataset's asset `name`, checked against the manifest's size and hash;
    DataError when it is not listed, missing, not a regular file inside `data_dir`, or altered."""
    entry = next((a for a in manifest.get("assets", []) if a.get("file") == name), None)
    path = join(data_dir, name)
    if entry is None:
        raise DataError(f"the dataset in {data_dir} lists no {name}; convert it again.")
    if not tf.io.gfile.exists(path) or (is_local(path) and not (
            is_regular_file(path) and resolves_inside(path, data_dir))):
        raise DataError(f"{path} is missing or not a regular file inside {data_dir}; convert the "
                        "dataset again.")
    content = read_bytes(path)
    if asset_entry(name, content) != entry:
        raise DataError(f"{path} is not the file the dataset was converted with (its size or "
                        "sha256 differs from dataset.json); convert the dataset again.")
    return content


def read_assets(data_dir: str, manifest: dict) -> dict[str, bytes]:
    """Every asset of the dataset in `data_dir`, by name, each checked (`read_asset`)."""
    return {entry["file"]: read_asset(data_dir, manifest, entry["file"])
            for entry in manifest.get("assets", [])}


def write(data_dir: str, manifest: dict) -> None:
    """Writes the manifest last, atomically, which makes `data_dir` a dataset."""
    write_json(join(data_dir, MANIFEST_NAME), {"format": FORMAT, **manifest})


def shard_files(data_dir: str, manifest: dict, split: str) -> list[str]:
    """The full paths of a split's shards; raises DataError for an unknown split."""
    splits = manifest["splits"]
    if split not in splits:
        raise DataError(
            f"dataset {data_dir} has no split {split!r}; it has: {', '.join(sorted(splits))}.")
    return [join(data_dir, shard["file"]) for shard in splits[split]["shards"]]


def shard_sizes(data_dir: str, manifest: dict, split: str) -> dict[str, int]:
    """The full path -> size in bytes of a split's shards, as the manifest records them."""
    shards = manifest["splits"][split]["shards"]
    return {join(data_dir, shard["file"]): shard["bytes"] for shard in shards}

"""`tftrain inspect`: describe a dataset, and verify every shard and record against its manifest.

`describe` reads only the manifest (label counts are recorded at conversion time; for a dataset
without them, the label feature alone is read). `verify` checks, for every shard: that it
exists, its size and sha256, that every record's CRCs are intact (TFRecord framing is
`len | crc(len) | data | crc(data)`; `TFRecordDataset` raises DataLossError on damage), that each
record parses against the schema, that its content is what the model can take (`ContentRules`:
class labels in [0, num_classes), token ids below vocab_size, real-valued labels finite; then
each split's label counts against the manifest's), and that the record count matches the
manifest. It streams: batches of BATCH records per shard, a few shards at a time.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import posixpath
import re
import time
from typing import Callable

import numpy as np
import tensorflow as tf
from absl import logging

from pipelines import dataset_pipeline
from tftrain.data import dataset_files
from tftrain.data import manifest as manifest_lib
from tftrain.data.reader import parse_spec
from tftrain.data.record_file import DamagedFile
from tftrain.data.shard_worker import label_key
from tftrain.errors import DataError
from tftrain.fileio import file_sha256, join

BATCH = 1024
MAX_LABEL_LINES = 40
MAX_CONTENT_PROBLEMS = 10  # per shard: the first ones say what is wrong
PROGRESS_SECONDS = 10  # a long verify logs how far it is at most this often


@dataclasses.dataclass
class Problem:
    """One damaged shard: the file, the record index (when known) and what is wrong."""

    file: str
    what: str
    record: int | None = None

    def __str__(self):
        where = f"{self.file}, record {self.record}" if self.record is not None else self.file
        return f"{where}: {self.what}"


def _size(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:,.0f} {unit}" if unit == "B" else f"{nbytes:,.1f} {unit}"
        nbytes /= 1024
    return ""


def label_counts(data_dir: str, manifest: dict, split: str) -> dict | None:
    """Label -> count for a split: from the manifest, or by reading the label feature."""
    entry = manifest["splits"][split]
    if "label_counts" in entry:
        return entry["label_counts"]
    key = manifest.get("label_key") or label_key(manifest["features"], manifest.get("info", {}))
    if not key:
        return None
    files = manifest_lib.shard_files(data_dir, manifest, split)
    sizes = manifest_lib.shard_sizes(data_dir, manifest, split)
    for file in files:
        dataset_files.check(file, data_dir, sizes.get(file))
    spec = {key: parse_spec({key: manifest["features"][key]})[key]}
    dataset = tf.data.TFRecordDataset(files).batch(BATCH).map(
        lambda s: tf.io.parse_example(s, spec)[key])
    counts: dict[str, int] = {}
    for batch in dataset.as_numpy_iterator():
        for value in batch.reshape(-1).tolist():
            counts[str(value)] = counts.get(str(value), 0) + 1
    return dict(sorted(counts.items(), key=lambda item: int(item[0])))


def describe(data_dir: str) -> str:
    """A text report: source, schema, per-split counts and shard sizes, label distribution."""
    manifest = manifest_lib.read(data_dir)
    splits = manifest["splits"]
    total = sum(s["num_examples"] for s in splits.values())
    nbytes = sum(sh["bytes"] for s in splits.values() for sh in s["shards"])
    lines = [f"dataset {data_dir}: {total:,} examples, {_size(nbytes)} "
             f"(pipeline {manifest['pipeline']}, tftrain {manifest.get('tool_version', '?')})",
             f"source: {manifest.get('source') or '(embedded)'}"]
    if "image/encoded" in manifest["features"]:
        lines.append(f"images: {image_encoding(manifest.get('info', {}))}")
    if manifest.get("info", {}).get("tokenizer"):
        lines.append(f"tokenizer: {tokenizer_line(manifest)}")
    lines.append("features:")
    width = max(map(len, manifest["features"]), default=0)
    for name, feature in sorted(manifest["features"].items()):
        extra = " (variable length)" if feature.get("varlen") else ""
        lines.append(f"  {name:<{width}}  {feature['dtype']} {feature.get('shape', [])}{extra}")
    lines.append("splits:")
    for split, entry in splits.items():
        sizes = [sh["bytes"] for sh in entry["shards"]]
        lines.append(f"  {split}: {entry['num_examples']} examples in {len(sizes)} shard(s), "
                     f"{_size(sum(sizes))} (shards {_size(min(sizes))} to {_size(max(sizes))})")
    bad = manifest.get("bad_rows", {})
    lines.append(f"bad rows skipped: {bad.get('count', 0):,}"
                 + (f" (listed in {join(data_dir, bad['file'])})" if bad.get("file") else ""))
    lines += _label_table(data_dir, manifest)
    return "\n".join(lines)


def tokenizer_line(manifest: dict) -> str:
    """A text dataset's tokenizer, as `describe` shows it: its kind, ids, model file and sample."""
    info = manifest["info"]
    line = f"{info['tokenizer']}, {info.get('vocab_size', '?')} ids"
    model = next((a for a in manifest.get("assets", [])
                  if a["file"] == info.get("tokenizer_model")), None)
    if model:
        line += f" (model {model['file']}, {_size(model['bytes'])}, sha256 {model['sha256'][:12]})"
    sample = info.get("vocabulary_sample")
    if isinstance(sample, dict) and "texts" in sample:
        line += (f"; fitted on {sample['texts']:,} of {sample.get('of_texts', '?'):,} training "
                 "texts" + (" (a seeded sample)" if sample.get("sampled") else ""))
    return line


def image_encoding(info: dict) -> str:
    """How a dataset's images are stored, as `describe` shows it (from `info["image_encoding"]`)."""
    encoding = info.get("image_encoding")
    size = "x".join(map(str, info.get("image_size", []))) or "?"
    if encoding == "raw":
        return f"raw uint8 pixels, {size} (read without decoding)"
    if encoding == "png":
        return f"png, re-encoded at {size} (lossless)"
    if encoding == "jpeg":
        return f"jpeg, re-encoded at {size}, quality {info.get('jpeg_quality', '?')}"
    if encoding == "keep":
        return f"keep: JPEG/PNG bytes as in the source (an array source: PNG), decoded to {size}"
    return "encoded bytes (image_encoding not recorded; decoded per image)"


def _label_table(data_dir: str, manifest: dict) -> list[str]:
    counts = {split: label_counts(data_dir, manifest, split) for split in manifest["splits"]}
    if not any(counts.values()):
        return []
    names = manifest.get("info", {}).get("class_names") or []
    labels = sorted({int(k) for c in counts.values() if c for k in c})
    key = manifest.get("label_key") or "label"
    lines = [f"labels ({key}):"]
    rows = [["label", *counts]]
    for label in labels[:MAX_LABEL_LINES]:
        name = f"{label} {names[label]}" if 0 <= label < len(names) and names[label] != str(label) else str(label)
        rows.append([name, *(f"{(c or {}).get(str(label), 0):,}" for c in counts.values())])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        lines.append("  " + "  ".join(cell.rjust(w) if i else cell.ljust(w)
                                      for i, (cell, w) in enumerate(zip(row, widths))))
    if len(labels) > MAX_LABEL_LINES:
        lines.append(f"  ... {len(labels) - MAX_LABEL_LINES} more labels")
    return lines


@dataclasses.dataclass
class ContentRules:
    """What the records' values must satisfy, from the manifest: class labels in
    [0, num_classes), token ids below vocab_size, real-valued labels finite; and that they
    decode, through the dataset's pipeline, as training decodes them (an image of the recorded
    size)."""

    label: str | None = None
    num_classes: int | None = None
    vocab_size: int | None = None
    token_features: tuple = ()
    decode: Callable | None = None  # parsed batch -> (inputs, label); None: not checked

    @classmethod
    def of(cls, manifest: dict) -> "ContentRules":
        info = manifest.get("info") or {}
        features = manifest["features"]
        key = manifest.get("label_key") or label_key(features, info)
        named = info.get("label")  # a real-valued label (regression) is named here only
        if key is None and isinstance(named, dict) and named.get("name") in features:
            key = named["name"]
        classes = info.get("num_classes")
        vocab = info.get("vocab_size")
        tokens = tuple(name for name, f in features.items()
                       if vocab and name != key and f["dtype"] == "int64")
        return cls(key if key in features else None,
                   classes if isinstance(classes, int) and classes > 0 else None,
                   vocab if isinstance(vocab, int) and vocab > 0 else None, tokens,
                   _decoder(manifest))

    def problems(self, name: str, parsed: dict, start: int) -> tuple[list[Problem], dict]:
        """The content problems of one parsed batch (the first record of each kind), and the
        batch's label counts (class labels only)."""
        found, counts = [], {}
        label = parsed.get(self.label) if self.label else None
        if label is not None and not isinstance(label, tf.RaggedTensor):
            values = label.numpy()
            values = values.reshape(len(values), -1)[:, 0]
            if label.dtype.is_floating:
                bad = ~np.isfinite(values)
                if bad.any():
                    found.append(Problem(name, f"label {self.label} is {values[bad][0]}, not a "
                                         "finite number", start + int(np.argmax(bad))))
            elif self.num_classes:
                bad = (values < 0) | (values >= self.num_classes)
                if bad.any():
                    found.append(Problem(name, f"label {self.label}={int(values[bad][0])} is "
                                         f"outside the {self.num_classes} classes [0, "
                                         f"{self.num_classes})", start + int(np.argmax(bad))))
                labels, numbers = np.unique(values, return_counts=True)
                counts = {str(int(k)): int(n) for k, n in zip(labels, numbers)}
        for feature in self.token_features:
            ids = parsed[feature]
            outside = (ids < 0) | (ids >= self.vocab_size)
            rows = tf.reduce_any(tf.reshape(outside, [tf.shape(outside)[0], -1])
                                 if not isinstance(outside, tf.RaggedTensor)
                                 else outside, axis=1).numpy()
            if rows.any():
                flat = ids.flat_values if isinstance(ids, tf.RaggedTensor) else tf.reshape(ids, [-1])
                bad = outside.flat_values if isinstance(outside, tf.RaggedTensor) \
                    else tf.reshape(outside, [-1])
                value = int(tf.boolean_mask(flat, bad)[0])
                found.append(Problem(name, f"token id {value} in {feature} is outside the "
                                     f"vocabulary [0, {self.vocab_size})",
                                     start + int(np.argmax(rows))))
        return found, counts


def _decoder(manifest: dict) -> Callable | None:
    """The dataset's own decoding of a parsed batch, or None (logged) when its pipeline is not
    built in (tftrain does not import code a dataset names)."""
    try:
        pipeline = dataset_pipeline(manifest.get("pipeline"))
    except DataError as e:
        logging.info("records parsed but not decoded: %s", e)
        return None
    info = manifest.get("info") or {}
    return lambda parsed: pipeline.decode(parsed, info)


def _decode_problem(name: str, batch, parsed: dict, spec: dict, decode: Callable,
                    start: int) -> Problem | None:
    """None when the batch decodes; else the first of its records that does not, with why."""
    try:
        decode(parsed)
        return None
    except (tf.errors.InvalidArgumentError, ValueError):
        pass
    for offset, record in enumerate(batch):
        try:
            decode(tf.io.parse_example(record[None], spec))
        except (tf.errors.InvalidArgumentError, ValueError) as e:
            message = _op_message(e) if isinstance(e, tf.errors.OpError) else str(e)
            return Problem(name, f"does not decode as the dataset's pipeline decodes it: "
                           f"{message.splitlines()[0][:300]}", start + offset)
    return Problem(name, "a batch does not decode as the dataset's pipeline decodes it", start)


def verify_shard(path: str, shard: dict, spec: dict,
                 rules: ContentRules | None = None) -> tuple[list[Problem], dict]:
    """Checks one shard's presence, size, sha256, record CRCs, parsing, content and count;
    returns the problems and the shard's label counts."""
    name = shard["file"]
    rules = rules or ContentRules()
    counts: dict = {}
    if not tf.io.gfile.exists(path):
        return [Problem(name, "the file is missing")], counts
    problems = []
    size = tf.io.gfile.stat(path).length
    if size != shard["bytes"]:
        problems.append(Problem(name, f"{size:,} bytes, the manifest says {shard['bytes']:,}"))
    try:  # before TensorFlow opens it: a link out, a FIFO, a lying length header
        dataset_files.check(path, posixpath.dirname(path))
    except DamagedFile as e:
        return problems + [Problem(name, e.what, e.record)], counts
    if file_sha256(path) != shard["sha256"]:
        problems.append(Problem(name, "sha256 differs from the manifest (the file was changed)"))
    count = 0
    batches = iter(tf.data.TFRecordDataset(path).batch(BATCH))
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            break
        except tf.errors.DataLossError:
            index, message = _find_corrupt_record(path, count)
            problems.append(Problem(name, f"corrupt record ({message}); it and the records "
                                    "after it cannot be read", index))
            return problems, counts
        try:
            parsed = tf.io.parse_example(batch, spec)
        except (tf.errors.InvalidArgumentError, UnicodeDecodeError):
            problems.append(_find_unparsable_record(name, batch, spec, count))
        else:
            found, batch_counts = rules.problems(name, parsed, count)
            undecoded = rules.decode and not found and _decode_problem(
                name, batch, parsed, spec, rules.decode, count)
            found += [undecoded] if undecoded else []
            problems.extend(found[:max(0, MAX_CONTENT_PROBLEMS - len(problems))])
            for label, number in batch_counts.items():
                counts[label] = counts.get(label, 0) + number
        count += int(batch.shape[0])
    if count < shard["num_examples"] and size < shard["bytes"]:
        # A cut inside a record header reads as a clean end of file: name where it ends.
        problems.append(Problem(name, f"truncated: the file ends after {count:,} of "
                                f"{shard['num_examples']:,} records", count))
    elif count != shard["num_examples"]:
        problems.append(Problem(name, f"{count:,} records, the manifest says {shard['num_examples']:,}"))
    return problems, counts


def _find_corrupt_record(path: str, start: int) -> tuple[int, str]:
    """The index of the first record at or after `start` that cannot be read, and the error."""
    index = start
    try:
        for _ in tf.data.TFRecordDataset(path).skip(start):
            index += 1
    except tf.errors.DataLossError as e:
        return index, _op_message(e)
    return index, "DataLossError"


def _op_message(error: tf.errors.OpError) -> str:
    """An op error's first line without TensorFlow's function and op decorations."""
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", error.message.splitlines()[0])
    return re.sub(r"\s*\[Op:.*$", "", text).strip()


def _find_unparsable_record(name: str, batch, spec: dict, start: int) -> Problem:
    for offset, record in enumerate(batch):
        try:
            tf.io.parse_single_example(record, spec)
        except UnicodeDecodeError:  # TensorFlow's message quoted the record's bytes
            return Problem(name, "does not parse against the schema: not a tf.train.Example",
                           start + offset)
        except tf.errors.InvalidArgumentError as e:
            message = _op_message(e)
            return Problem(name, f"does not parse against the schema: {message}", start + offset)
    return Problem(name, "a batch does not parse against the schema", start)


def verify(data_dir: str, threads: int = 4) -> list[Problem]:
    """Checks every shard of every split (in `threads` threads); returns the problems found."""
    manifest = manifest_lib.read(data_dir)
    spec = parse_spec(manifest["features"])
    rules = ContentRules.of(manifest)
    jobs = [(split, join(data_dir, shard["file"]), shard)
            for split, entry in manifest["splits"].items() for shard in entry["shards"]]
    results, shown = [], time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
        for done, result in enumerate(pool.map(
                lambda job: verify_shard(job[1], job[2], spec, rules), jobs), 1):
            results.append(result)
            if time.monotonic() - shown > PROGRESS_SECONDS and done < len(jobs):
                shown = time.monotonic()
                logging.info("verified %d of %d shards of %s", done, len(jobs), data_dir)
    found = [problem for problems, _ in results for problem in problems]
    if rules.num_classes and not found:  # the records' label counts against the manifest's
        for split, entry in manifest["splits"].items():
            counted: dict = {}
            for (job_split, _, _), (_, counts) in zip(jobs, results):
                for label, number in counts.items() if job_split == split else ():
                    counted[label] = counted.get(label, 0) + number
            recorded = {k: v for k, v in (entry.get("label_counts") or {}).items() if v}
            if "label_counts" in entry and recorded != counted:
                differ = sorted(set(recorded) | set(counted), key=int)
                first = next(k for k in differ if recorded.get(k) != counted.get(k))
                found.append(Problem(f"split {split}", f"label {first}: {counted.get(first, 0):,} "
                                     f"records, the manifest's label_counts say "
                                     f"{recorded.get(first, 0):,}"))
    for entry in manifest.get("assets", []):
        try:
            manifest_lib.read_asset(data_dir, manifest, entry["file"])
        except DataError as e:
            found.append(Problem(entry["file"], str(e)))
    return found


def verify_or_raise(data_dir: str) -> str:
    """Runs `verify`; returns a one-line success message or raises DataError naming the damage."""
    problems = verify(data_dir)
    manifest = manifest_lib.read(data_dir)
    shards = sum(len(s["shards"]) for s in manifest["splits"].values())
    records = sum(s["num_examples"] for s in manifest["splits"].values())
    if problems:
        listed = "; ".join(str(p) for p in problems[:10])
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise DataError(f"dataset {data_dir} is damaged: {listed}{more}. Convert it again "
                        "(tftrain convert ... --overwrite) or restore the files from a copy.")
    return f"verified {data_dir}: {shards} shard(s), {records:,} records, all intact"

"""`tftrain convert --append`: a dataset that grows, new shards beside the old ones.

The rows of the new source are encoded with the dataset's own `info` (its vocabulary, class
list, image size, statistics), so an id means what it meant; what would need another `info` is
refused in one line: another pipeline, another schema, another setting the pipeline recorded
(`max_length`, `lowercase`, `image_size`, ...), a class the dataset does not have. Words the
dataset's vocabulary lacks become the out-of-vocabulary id, as unseen text does at training
time; the share is logged and recorded. The old shard files are not touched; the manifest
that lists old and new shards replaces the old one atomically (`tftrain.data.writer`).
"""
from __future__ import annotations

import tensorflow as tf
from absl import logging

import tftrain
from tftrain import ownership
from tftrain.errors import ConfigError, TftrainError

# `info` keys that describe the data rather than how it is encoded: they may differ.
DESCRIBES_DATA = {"source", "vocabulary", "vocab_size", "vocabulary_sample", "num_examples",
                  "label_stats", "num_lines", "num_characters", "source_splits", "class_names",
                  "num_classes", "columns"}


def appendable(output_dir: str, expected: dict | None = None) -> ownership.DatasetContents:
    """What `output_dir` holds, when it is a tftrain dataset (and, with `expected`, still the
    one whose manifest that is); raises otherwise."""
    if not tf.io.gfile.isdir(output_dir):
        raise TftrainError(f"--append adds to a tftrain dataset, and {output_dir} is not a "
                           "directory: convert into it without --append first.")
    contents = ownership.dataset_contents(output_dir)
    if contents.manifest is None:
        raise TftrainError(f"--append adds to a tftrain dataset, and {output_dir} holds none (no "
                           "readable dataset.json): convert into it without --append first.")
    if expected is not None and contents.manifest != expected:
        raise TftrainError(f"the dataset in {output_dir} changed while this append was "
                           "preparing (another conversion?): run the append again.")
    return contents


def appended_info(pipeline, existing: dict, new_info: dict, output_dir: str) -> dict:
    """The dataset's `info`, with which the new rows are encoded; raises ConfigError when the
    new source would need another one (see the module doc)."""
    where = f"--append to {output_dir}"
    if pipeline.name != existing["pipeline"]:
        raise ConfigError(f"{where}: it was converted with pipeline {existing['pipeline']!r}, not "
                          f"{pipeline.name!r}; append with --pipeline={existing['pipeline']} and "
                          "the options it was converted with.")
    old = existing["info"]
    if pipeline.features(new_info) != existing["features"]:
        raise ConfigError(f"{where}: the new data's features ({sorted(pipeline.features(new_info))}"
                          ") are not the dataset's; append data of the same shape and options.")
    for key, value in old.items():
        if key not in DESCRIBES_DATA and not isinstance(value, (dict, list)) and \
                new_info.get(key) != value:
            raise ConfigError(f"{where}: the dataset has info.{key}={value!r}, the new data gives "
                              f"{new_info.get(key)!r}; append with the --pipeline_options it was "
                              "converted with.")
    _check_classes(old, new_info, where)
    vocabulary = old.get("vocabulary")
    if isinstance(vocabulary, list) and isinstance(new_info.get("vocabulary"), list):
        known = set(vocabulary)
        new_words = new_info["vocabulary"]
        missing = sum(1 for word in new_words if word not in known) / max(1, len(new_words))
        logging.info("%s: %.1f%% of the new data's vocabulary is not in the dataset's; those "
                     "words become the out-of-vocabulary id", where, 100 * missing)
        return {**old, "appended_out_of_vocabulary": round(missing, 4)}
    return dict(old)


def _check_classes(old: dict, new_info: dict, where: str) -> None:
    """Raises ConfigError for a class of the new data that the dataset does not have."""
    names = old.get("class_names")
    if isinstance(names, list) and isinstance(new_info.get("class_names"), list):
        extra = sorted(set(new_info["class_names"]) - set(names))
        if extra:
            raise ConfigError(f"{where}: class(es) {', '.join(map(repr, extra[:5]))} are not among "
                              f"the dataset's {len(names)} classes; a class list that changes needs "
                              "a new conversion of all the data (--overwrite).")
    elif isinstance(old.get("num_classes"), int) and \
            int(new_info.get("num_classes") or 0) > old["num_classes"]:
        raise ConfigError(f"{where}: the new data has class ids up to "
                          f"{new_info['num_classes'] - 1}, the dataset {old['num_classes']} "
                          "classes; a class list that changes needs a new conversion of all the "
                          "data (--overwrite).")


def appended(existing: dict, added: dict) -> dict:
    """The manifest of `existing` with the splits, bad rows and history of `added` (the
    manifest the append would have written alone) merged in."""
    splits = {name: dict(entry) for name, entry in existing["splits"].items()}
    for name, entry in added["splits"].items():
        merged = splits.setdefault(name, {"num_examples": 0, "shards": []})
        merged["num_examples"] += entry["num_examples"]
        merged["shards"] = list(merged["shards"]) + list(entry["shards"])
        if "label_counts" in entry or "label_counts" in merged:
            counts = dict(merged.get("label_counts", {}))
            for label, count in entry.get("label_counts", {}).items():
                counts[label] = counts.get(label, 0) + count
            merged["label_counts"] = counts
    old_bad, new_bad = existing.get("bad_rows", {}), added["bad_rows"]
    by_split = dict(old_bad.get("by_split", {}))
    for split, count in new_bad["by_split"].items():
        by_split[split] = by_split.get(split, 0) + count
    count = old_bad.get("count", 0) + new_bad["count"]
    bad_rows = {"count": count, "by_split": by_split,
                **({"file": new_bad.get("file") or old_bad.get("file")} if count else {})}
    history = list(existing.get("appends", ())) + [{
        "source": added["source"], "tool_version": tftrain.__version__,
        "examples": sum(entry["num_examples"] for entry in added["splits"].values()),
        "bad_rows": new_bad["count"]}]
    kept = {key: value for key, value in existing.items() if key != "format"}
    return {**kept, "splits": splits, "bad_rows": bad_rows, "appends": history}

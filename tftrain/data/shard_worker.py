"""One conversion worker: reads its share of the rows, encodes them and writes its own shards.

A worker streams: one row is read, encoded, serialized and appended to its shard before the
next is read. Each shard is written under a temporary name (unique to the run) and renamed when
complete; bad rows go to the worker's own temporary JSON-lines file. The worker returns a small
summary (per shard: file, count, bytes, sha256; bad-row and label counts); the main process
writes the manifest once every worker has succeeded.
"""
from __future__ import annotations

import collections
import json
import os
import sys
import time
import traceback

from tftrain.data import example_bytes
from tftrain.data.record_file import RecordFile
from tftrain.errors import BadRow, DataError
from tftrain.host import die_with_parent, leave_forkserver

REPORT_EVERY_S = 0.5
LABEL_KEYS = ("image/class/label", "label", "labels", "y")
MAX_LABELS = 10_000  # beyond this many distinct values, label counts are not kept


class RowFailed(Exception):
    """A pipeline's encode() raised something other than BadRow (a bug, not a bad row)."""

    def __init__(self, key: str, error: BaseException):
        super().__init__(f"{type(error).__name__}: {error} (while encoding row {key!r})")


def label_key(features: dict, info: dict) -> str | None:
    """The int64 scalar feature holding the class label, if the schema has one."""
    candidates = list(LABEL_KEYS)
    label_info = info.get("label")
    if isinstance(label_info, dict) and label_info.get("name"):
        candidates.insert(0, label_info["name"])
    for key in candidates:
        spec = features.get(key)
        if spec and spec.get("dtype") == "int64" and list(spec.get("shape", [])) in ([], [1]):
            return key
    return None


def bad_rows_tmp(plan, worker: int) -> str:
    """The temporary JSON-lines file of `worker`'s bad rows."""
    return plan.tmp_path(f"bad_rows-{worker:05d}.jsonl")


def run(pipeline, source: str, info: dict, plan, worker: int, *, report=None,
        alive=lambda: True) -> dict:
    """Converts worker `worker`'s share of the rows; returns its summary.

    `report(examples, bytes, bad)` is called about every REPORT_EVERY_S with the counts since
    the last call. `alive()` is checked before each shard is renamed: a worker whose parent is
    gone never publishes a shard.
    """
    import tensorflow as tf

    key = label_key(pipeline.features(info), info)
    writers: dict[tuple[str, int], RecordFile] = {}
    labels: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    bad_counts: collections.Counter = collections.Counter()
    bad_file = tf.io.gfile.GFile(bad_rows_tmp(plan, worker), "w")
    pending = [0, 0, 0]
    last_report = time.monotonic()
    try:
        rows = pipeline.read(source, info, worker, plan.num_workers)
        while True:
            try:
                row = next(rows)
            except StopIteration:
                break
            except BadRow as e:
                raise DataError(
                    f"pipeline {pipeline.name!r} raised BadRow from read() ({e}); a generator cannot "
                    "continue after raising, so rows would be lost. Raise BadRow from encode(), or "
                    "yield Row(key, BadRow(reason)) from read().") from None
            split = plan.split_of(row)
            try:
                if isinstance(row.value, BadRow):
                    raise row.value
                example = pipeline.encode(row, info)
                data = example_bytes.serialize(example)
            except BadRow as e:
                bad_file.write(json.dumps({"key": row.key, "split": split, "reason": str(e)}) + "\n")
                bad_counts[split] += 1
                pending[2] += 1
                continue
            except Exception as e:
                raise RowFailed(row.key, e) from e
            shard = (split, plan.shard_of(row.key, split, worker))
            writer = writers.get(shard)
            if writer is None:
                writer = writers[shard] = RecordFile(plan.tmp_path(plan.file_name(*shard)))
            writer.write(data)
            if key is not None and len(labels[split]) <= MAX_LABELS:
                label = example_bytes.int64_scalar(example, key)
                if label is not None:
                    labels[split][label] += 1
            pending[0] += 1
            pending[1] += len(data)
            if report and time.monotonic() - last_report >= REPORT_EVERY_S:
                report(*pending)
                pending = [0, 0, 0]
                last_report = time.monotonic()
    finally:
        for writer in writers.values():
            writer.close()
        bad_file.close()
    if report:
        report(*pending)

    # Every owned shard of every split this worker saw exists, even when empty.
    for split in {s for s, _ in writers} | set(bad_counts):
        for index in plan.owned(split, worker):
            if (split, index) not in writers:
                writers[(split, index)] = RecordFile(plan.tmp_path(plan.file_name(split, index)))
    return {"worker": worker, "shards": publish(plan, writers, alive),
            "bad_rows": dict(bad_counts),
            "labels": {s: {str(k): n for k, n in c.items()} for s, c in labels.items()
                       if len(c) <= MAX_LABELS}}


def publish(plan, shards: dict, alive) -> list[dict]:
    """Closes each shard ((split, index) -> RecordFile) and renames it to its final name.

    Never over a file that exists: the writer cleared this conversion's own files first, so one
    there now was not written by it. A shard of a split the plan did not foresee (not listed in
    the conversion marker) is claimed first (`plan.claim_path`). Returns the manifest entries
    (count, bytes and sha256 come from writing, not re-reading).
    """
    import tensorflow as tf

    from tftrain.fileio import join

    entries = []
    for (split, index), shard in sorted(shards.items()):
        name = plan.file_name(split, index)
        nbytes, sha256 = shard.close()
        entry = {"split": split, "index": index, "file": name, "num_examples": shard.records,
                 "bytes": nbytes, "sha256": sha256}
        if not alive():
            raise DataError("the converting process is gone; not publishing shards.")
        if not plan.foresees(split):
            with tf.io.gfile.GFile(plan.claim_path(name), "w") as claim:
                claim.write(name)
        target = join(plan.output_dir, name)
        try:
            tf.io.gfile.rename(plan.tmp_path(name), target, overwrite=False)
        except tf.errors.AlreadyExistsError:
            raise DataError(f"{target} appeared during the conversion and was not written by it; "
                            "tftrain does not replace files it did not write. Move it away and "
                            "convert again.") from None
        entries.append(entry)
    return entries


# ---- the worker process --------------------------------------------------------------------

def process_main(pipeline, source, info, plan, worker, queue, main_pid) -> None:
    """Entry point of a worker process: runs `run` and sends progress and the outcome on `queue`.

    Messages: ("progress", worker, examples, bytes, bad), ("done", worker, summary) or
    ("error", worker, class name, message, traceback text).
    """
    from tftrain.data.processes import pid_alive

    parent = os.getppid()  # the forkserver, which exits as soon as the converting process does
    die_with_parent()
    leave_forkserver()  # or the forkserver would live as long as this worker

    def alive():
        return os.getppid() == parent and pid_alive(main_pid)

    if not alive():  # the converting process died before this worker got going
        os._exit(1)
    try:
        summary = run(pipeline, source, info, plan, worker,
                      report=lambda *c: queue.put(("progress", worker, *c)),
                      alive=alive)
        queue.put(("done", worker, summary))
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the main process
        queue.put(("error", worker, type(e).__name__, str(e), traceback.format_exc()))
        sys.exit(1)

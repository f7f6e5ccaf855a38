"""`write_dataset`: converts a pipeline's rows into sharded TFRecord files with a manifest.

Steps: check the output directory (`check_output_dir`); `pipeline.prepare`; a first look at the
rows (`shard_plan.take_sample`) to size the shards; claim the output directory
(`claim_output_dir`); W worker processes (forked from a clean forkserver, see `processes`), each
reading its own share of the rows and writing its own shards (`shard_worker`); then
`bad_rows.jsonl` and, last, `dataset.json`. Every shard is written under a temporary name and
renamed when complete, and the manifest comes last, so an interrupted conversion (Ctrl-C,
kill -9, a failed worker) never leaves a directory that a reader accepts; the rerun clears what
it left and completes.

Ownership (see `tftrain.ownership`): tftrain deletes only what it can prove it wrote. Claiming
the directory locks it against a second conversion (`dir_lock`), writes the conversion marker
`.tftrain-convert.json` (this run's id and pid and every name it writes or takes over) before
anything else, and only then clears tftrain's own earlier files: those of an interrupted
conversion (listed by its marker) or of the complete dataset being replaced (listed by its
dataset.json, with `overwrite`). Files tftrain did not write are kept: without `overwrite` a
directory holding any is refused; with it the conversion writes beside them, and refuses if it
would write a file under one of their names. The marker is removed right after dataset.json is
written; one left by a kill at that instant is harmless (the next conversion takes it over).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import queue as queue_lib
import time
import uuid
from typing import Iterator

import tensorflow as tf
from absl import logging

import tftrain
from pipelines import BasePipeline
from tftrain import dir_lock, ownership
from tftrain.data import manifest as manifest_lib
from tftrain.data.append import appendable, appended, appended_info
from tftrain.data import processes, shard_plan, shard_worker
from tftrain.data.progress import Progress
from tftrain.data.record_file import RecordFile
from tftrain.errors import ConfigError, DataError, TftrainError
from tftrain.fileio import join, remove, write_atomic

BAD_ROWS_NAME = manifest_lib.BAD_ROWS_NAME
# Entries that stay when a conversion clears tftrain's earlier files or fails.
_KEPT = {dir_lock.CONVERT_LOCK, ownership.CONVERT_MARKER}


def check_output_dir(output_dir: str, overwrite: bool) -> ownership.DatasetContents:
    """Raises unless a conversion may write into `output_dir`; returns what is there.

    Refused without `overwrite`: a complete dataset, and any entry tftrain did not write.
    Always refused: an `output_dir` that exists and is not a directory.
    """
    if tf.io.gfile.exists(output_dir) and not tf.io.gfile.isdir(output_dir):
        raise TftrainError(f"--output={output_dir} exists and is not a directory; convert into a "
                           "new or empty directory.")
    contents = ownership.dataset_contents(output_dir)
    if contents.manifest is not None and not overwrite:
        raise TftrainError(
            f"{output_dir} already holds a complete dataset; pass --overwrite to replace it.")
    if contents.foreign and not overwrite:
        raise TftrainError(
            f"{output_dir} holds {ownership.describe(contents.foreign)} that tftrain did not "
            "write: it is neither a tftrain dataset nor an interrupted tftrain conversion. "
            "Convert into a new or empty --output, or pass --overwrite to write the dataset "
            "beside them (they are kept).")
    return contents


def _refuse_collisions(contents: ownership.DatasetContents, writes: set[str]) -> None:
    """Raises if this conversion would write a file under the name of one tftrain did not write."""
    taken = sorted(contents.foreign & writes)
    if taken:
        what = ("its manifest" if taken[0] == manifest_lib.MANIFEST_NAME else
                "its list of bad rows" if taken[0] == BAD_ROWS_NAME else "a shard")
        others = f" (and {len(taken) - 1} more: {', '.join(taken[1:4])})" if len(taken) > 1 else ""
        raise TftrainError(
            f"{join(contents.directory, taken[0])} was not written by tftrain, and this "
            f"conversion writes {what} under that name{others}; tftrain does not replace files "
            "it did not write. Move it away, or convert into a new or empty --output.")


@contextlib.contextmanager
def claim_output_dir(plan, overwrite: bool, append_to: dict | None = None,
                     assets: dict | None = None) -> Iterator[None]:
    """Holds `plan.output_dir` for one conversion (see the module doc): locked, checked,
    marked as this run's, tftrain's earlier files cleared, the pipeline's `assets` written;
    the marker goes when done.

    `append_to` (the dataset's manifest, `convert --append`): the dataset's own files stay, and
    so does its manifest until the new one replaces it (its assets are the dataset's)."""
    output_dir = plan.output_dir
    tf.io.gfile.makedirs(output_dir)
    with dir_lock.exclusive(output_dir, dir_lock.CONVERT_LOCK, "tftrain convert"):
        if append_to is not None:  # again: another run may have changed it
            contents = appendable(output_dir, append_to)
        else:
            contents = check_output_dir(output_dir, overwrite)
        new_assets = dict(assets or {}) if append_to is None else {}
        writes = set(plan.file_names()) | {BAD_ROWS_NAME, manifest_lib.MANIFEST_NAME} | set(new_assets)
        _refuse_collisions(contents, writes)
        earlier = contents.mine - _KEPT - (contents.listed() if append_to is not None else set())
        ownership.write_convert_marker(output_dir, plan.run_id, writes | earlier)
        if contents.manifest is not None and append_to is None:
            # The manifest goes first: from here on the directory is not a dataset until rewritten.
            remove(join(output_dir, manifest_lib.MANIFEST_NAME), within=output_dir)
        for name in sorted(earlier - {manifest_lib.MANIFEST_NAME}):
            remove(join(output_dir, name), within=output_dir)
        for name, content in new_assets.items():
            write_atomic(join(output_dir, name), content)
        yield
        done = ownership.dataset_contents(output_dir)
        for name in sorted(done.mine - done.listed() - _KEPT):
            remove(join(output_dir, name), within=output_dir)  # claims of unforeseen shards, now in dataset.json
        remove(join(output_dir, ownership.CONVERT_MARKER), within=output_dir)  # last: it claims what is left


def write_dataset(pipeline: BasePipeline, source: str, output_dir: str, *,
                  splits: dict[str, float] | None = None, num_shards: int | None = None,
                  shard_size_mb: float | None = None, workers: int | None = None, seed: int = 0,
                  overwrite: bool = False, max_bad_fraction: float = 0.01,
                  progress: bool = True, append: bool = False) -> dict:
    """Converts `source` with `pipeline` into `output_dir`; returns the manifest.

    Rows keep their source split unless `splits` (name -> fraction) is given; rows without one
    use `pipeline.default_splits`. Shards per split: `num_shards`, or sized to about
    `shard_size_mb` (default 150) from an estimate, at least one per worker. `workers`: worker
    processes (None: all cores, or 1 for a small source). Rows the pipeline rejects (BadRow) are
    skipped and listed in bad_rows.jsonl; above `max_bad_fraction` of all rows the run fails and
    leaves no dataset. See `tftrain.data.shard_plan` for what is deterministic.

    `append`: adds the rows to the tftrain dataset in `output_dir` as new shards (see `appended`):
    its files stay byte for byte and its manifest is replaced, atomically, by one that lists
    both; the rows are encoded with the dataset's own `info` (vocabulary, classes, statistics).
    """
    shard_plan.check_args(num_shards=num_shards, shard_size_mb=shard_size_mb, workers=workers,
                          max_bad_fraction=max_bad_fraction)
    if append and overwrite:
        raise ConfigError("--append adds to a dataset and --overwrite replaces it: pass one.")
    existing = appendable(output_dir).manifest if append else None
    if not append:
        check_output_dir(output_dir, overwrite)
    with processes.server(processes.needs_workers(pipeline, source, workers)):
        # the server of the workers starts now: its TensorFlow import overlaps prepare()
        started = time.monotonic()
        pipeline.requested_splits = dict(splits) if splits else None
        info = pipeline.prepare(source)
        if existing is not None:
            info = appended_info(pipeline, existing, info, output_dir)
            pipeline.load_assets(output_dir, existing)  # the dataset's tokenizer, not a new one
        plan, estimated_rows = make_plan(pipeline, source, info, output_dir, splits=splits,
                                         num_shards=num_shards, shard_size_mb=shard_size_mb,
                                         workers=workers, seed=seed,
                                         generation=len(existing.get("appends", ())) + 1
                                         if existing is not None else 0)
        with claim_output_dir(plan, overwrite, existing, pipeline.assets):
            meter = Progress(estimated_rows, label=f"convert {pipeline.name}") if progress else None
            try:
                if plan.num_workers == 1:
                    summaries = [shard_worker.run(pipeline, source, info, plan, 0,
                                                  report=meter.update if meter else None)]
                else:
                    with processes.server(needed=True):  # when not started before the plan
                        summaries = _run_processes(pipeline, source, info, plan, meter)
                if meter:
                    meter.close()
                manifest = finish(pipeline, source, info, plan, summaries, splits, max_bad_fraction,
                                  existing)
            except shard_worker.RowFailed as e:
                remove_shards(plan)
                raise DataError(f"pipeline {pipeline.name!r} failed: {e}") from e
            except BaseException:
                remove_shards(plan)
                raise
    add_stats(manifest, started, plan.num_workers)
    logging.info("%s", summary_line(output_dir, manifest))
    return manifest


def add_stats(manifest: dict, started: float, workers: int) -> None:
    """Adds the run's speed to the returned manifest (not to dataset.json, which stays reproducible).

    `workers=0` stands for a Beam job.
    """
    elapsed = time.monotonic() - started
    total = sum(s["num_examples"] for s in manifest["splits"].values())
    nbytes = sum(sh["bytes"] for s in manifest["splits"].values() for sh in s["shards"])
    manifest["stats"] = {"seconds": elapsed, "examples_per_second": total / max(elapsed, 1e-9),
                         "mb_per_second": nbytes / shard_plan.MB / max(elapsed, 1e-9),
                         "workers": workers}


def summary_line(output_dir: str, manifest: dict) -> str:
    """One line: where, counts per split, shards, bad rows and (when known) speed."""
    splits = manifest["splits"]
    counts = ", ".join(f"{k}={v['num_examples']:,}" for k, v in splits.items())
    shards = sum(len(v["shards"]) for v in splits.values())
    bad = manifest["bad_rows"]["count"]
    text = f"wrote {output_dir}: {counts} in {shards} shard(s); {bad:,} bad row(s) skipped"
    if bad:
        text += f" (see {join(output_dir, BAD_ROWS_NAME)})"
    stats = manifest.get("stats")
    if stats:
        text += (f"; {stats['seconds']:.1f}s, {stats['examples_per_second']:,.0f} examples/s, "
                 f"{stats['mb_per_second']:,.1f} MB/s "
                 + (f"with {stats['workers']} worker(s)" if stats["workers"] else "with Beam"))
    return text


def make_plan(pipeline, source, info, output_dir, *, splits, num_shards, shard_size_mb,
               workers, seed, generation: int = 0):
    fractions = dict(splits) if splits else None
    default_fractions = dict(pipeline.default_splits)
    probe = shard_plan.ShardPlan(output_dir, "", 1, seed, {}, 1, fractions, default_fractions)
    sample = shard_plan.take_sample(pipeline, source, info, probe.split_of)
    if sample.exhausted and sample.rows == 0:
        raise DataError(f"no rows were read from {source!r} by pipeline {pipeline.name!r}; check "
                        "--input.")
    if sample.bad_reasons and not sample.encoded_rows and len(sample.bad_reasons) >= 16:
        raise DataError(
            f"the first {len(sample.bad_reasons)} rows of {source!r} are all bad rows for pipeline "
            f"{pipeline.name!r}, e.g. {sample.bad_reasons[0]}; check --input and --pipeline_options.")
    sizes = None if sample.exhausted else shard_plan.source_bytes(source)
    num_workers, shards, default, estimated_rows, notes = shard_plan.choose(
        sample=sample, sizes=sizes, fractions=fractions, default_fractions=default_fractions,
        workers=workers, num_shards=num_shards, shard_size_mb=shard_size_mb)
    for note in notes:
        logging.info("convert: %s", note)
    plan = shard_plan.ShardPlan(output_dir, uuid.uuid4().hex[:12], num_workers, seed, shards,
                                default, fractions, default_fractions, generation)
    logging.info("convert: %s rows (%s), ~%.0f bytes per example; %d worker(s); shards: %s",
                 f"{sample.rows:,}" if sample.exhausted else
                 (f"~{estimated_rows:,}" if estimated_rows else "an unknown number of"),
                 "exact" if sample.exhausted else "estimated", sample.example_bytes, num_workers,
                 ", ".join(f"{k}={v}" for k, v in sorted(shards.items())) or default)
    return plan, estimated_rows


def _run_processes(pipeline, source, info, plan, meter) -> list[dict]:
    """Runs the worker processes; returns their summaries or raises one clear error."""
    context = processes.context()
    messages = context.Queue()
    procs = []
    try:
        for worker in range(plan.num_workers):
            process = context.Process(
                target=shard_worker.process_main, name=f"tftrain-convert-{worker}", daemon=True,
                args=(pipeline, source, info, plan, worker, messages, os.getpid()))
            try:
                process.start()
            except (TypeError, AttributeError, ValueError) as e:  # pickling the pipeline
                raise ConfigError(
                    f"pipeline {pipeline.name!r} cannot be sent to worker processes ({e}); make it "
                    "picklable (define it at module level) or pass --workers=1.") from None
            procs.append(process)
        return _collect(procs, messages, plan, meter)
    finally:
        for process in procs:
            if process.is_alive():
                process.kill()
        for process in procs:
            process.join()
        messages.close()


def _collect(procs, messages, plan, meter) -> list[dict]:
    """Receives progress and outcomes; raises one clear error for a failed or vanished worker."""
    summaries: dict[int, dict] = {}

    def handle(message) -> None:
        kind, worker = message[0], message[1]
        if kind == "progress":
            if meter:
                meter.update(*message[2:])
        elif kind == "done":
            summaries[worker] = message[2]
        else:
            _, _, name, text, trace = message
            if "No space left on device" in text:  # the CLI's one line for a full disk
                raise OSError(errno.ENOSPC, f"conversion worker {worker} of {len(procs)}: {text}")
            error = {"ConfigError": ConfigError, "DataError": DataError,
                     "RowFailed": DataError, "TftrainError": TftrainError}.get(name)
            if error is None:  # not a problem the user can fix: keep the worker's traceback
                logging.error("conversion worker %d failed:\n%s", worker, trace)
                error, text = DataError, f"{name}: {text}"
            raise error(f"conversion worker {worker} of {len(procs)} failed: {text}")

    last_check = time.monotonic()
    while len(summaries) < len(procs):
        try:
            handle(messages.get(timeout=0.5))
            if time.monotonic() - last_check < 1.0:
                continue
        except queue_lib.Empty:
            pass
        last_check = time.monotonic()
        for worker, process in enumerate(procs):
            if worker in summaries or process.exitcode is None:
                continue
            deadline = time.monotonic() + 2  # its last messages may still be in the pipe
            while worker not in summaries and time.monotonic() < deadline:
                try:
                    handle(messages.get(timeout=0.2))
                except queue_lib.Empty:
                    pass
            if worker not in summaries:
                raise DataError(_died(worker, len(procs), process.exitcode))
    return [summaries[w] for w in range(len(procs))]


def _died(worker: int, workers: int, exitcode: int) -> str:
    how = (f"was killed by signal {-exitcode}" + (" (out of memory?)" if exitcode == -9 else "")
           if exitcode < 0 else f"exited with code {exitcode}")
    return (f"conversion worker {worker} of {workers} {how} without reporting; nothing was "
            "published. Rerun the conversion (with fewer --workers if memory is short).")


def remove_shards(plan) -> None:
    """Best-effort removal of this conversion's shards and temporary files after a failure.

    Kept: bad_rows.jsonl (it says why) and the marker, which still claims it for the rerun. An
    append (`plan.generation`) keeps the dataset's own files and, once it has cleared its own,
    removes its marker: the dataset is as it was.
    """
    try:
        contents = ownership.dataset_contents(plan.output_dir)
        if contents.manifest is not None and not plan.generation:
            return  # dataset.json was written: the dataset is complete
        kept = _KEPT | {BAD_ROWS_NAME} | (contents.listed() if plan.generation else set())
        for name in sorted(contents.mine - kept):
            remove(join(plan.output_dir, name), within=plan.output_dir)
        if plan.generation:
            remove(join(plan.output_dir, ownership.CONVERT_MARKER), within=plan.output_dir)
    except (OSError, tf.errors.OpError) as e:
        logging.warning("could not clean %s: %s", plan.output_dir, e)


def finish(pipeline, source, info, plan, summaries, splits, max_bad_fraction,
           existing: dict | None = None) -> dict:
    """Checks the bad-row fraction, completes empty shards, writes bad_rows.jsonl and the manifest
    (with `existing`, the dataset appended to, one that lists its shards and the new ones)."""
    shards = {}
    for summary in summaries:
        for entry in summary["shards"]:
            shards[(entry["split"], entry["index"])] = entry
    bad_by_split: dict[str, int] = {}
    for summary in summaries:
        for split, n in summary["bad_rows"].items():
            bad_by_split[split] = bad_by_split.get(split, 0) + n
    num_bad = sum(bad_by_split.values())
    num_good = sum(e["num_examples"] for e in shards.values())
    failure = _bad_fraction_failure(num_good, num_bad, max_bad_fraction)
    if failure and existing is not None:  # the dataset, its bad_rows.jsonl included, stays
        reasons = _first_bad_rows(plan)
        _merge_bad_rows(plan, None)
        remove_shards(plan)
        raise DataError(f"{failure}: appending {source!r} failed and left the dataset in "
                        f"{plan.output_dir} as it was. First bad rows: {reasons}; fix the input, "
                        "or raise --max_bad_fraction to skip them.")
    bad_path = join(plan.output_dir, BAD_ROWS_NAME)
    kept_bad = bool(existing and existing.get("bad_rows", {}).get("file"))
    _merge_bad_rows(plan, bad_path if num_bad else None, keep=kept_bad)
    if failure:
        remove_shards(plan)
        raise DataError(f"{failure}: converting {source!r} with pipeline {pipeline.name!r} failed "
                        f"and left no dataset. Each bad row and why is in {bad_path}; fix the "
                        "input, or raise --max_bad_fraction to skip them.")
    seen = {split for split, _ in shards} | set(bad_by_split) | set(splits or ())
    entries = {}
    for split in sorted(seen):
        for index in range(plan.num_shards(split)):
            if (split, index) not in shards:
                shards[(split, index)] = _empty_shard(plan, split, index)
        split_shards = [{k: shards[(split, i)][k] for k in ("file", "num_examples", "bytes", "sha256")}
                        for i in range(plan.num_shards(split))]
        entries[split] = {"num_examples": sum(s["num_examples"] for s in split_shards),
                          "shards": split_shards}
        labels = _merge_labels(summaries, split)
        if labels is not None:
            entries[split]["label_counts"] = labels
        if not entries[split]["num_examples"]:
            logging.warning("split %r has no examples.", split)
    manifest = {"pipeline": pipeline.name, "source": str(source), "tool_version": tftrain.__version__,
                "features": pipeline.features(info), "info": info, "splits": entries,
                "bad_rows": {"count": num_bad, "by_split": bad_by_split,
                             **({"file": BAD_ROWS_NAME} if num_bad else {})},
                "label_key": shard_worker.label_key(pipeline.features(info), info),
                "workers": plan.num_workers, "seed": plan.seed}
    if pipeline.assets:
        manifest["assets"] = [manifest_lib.asset_entry(name, content)
                              for name, content in sorted(pipeline.assets.items())]
    if existing is not None:
        manifest = appended(existing, manifest)
    manifest_lib.write(plan.output_dir, manifest)
    return manifest_lib.read(plan.output_dir)


def _bad_fraction_failure(num_good: int, num_bad: int, max_bad_fraction: float) -> str | None:
    """Why the conversion fails on its bad rows, or None."""
    if num_good == 0:
        return "no examples were written"
    fraction = num_bad / (num_good + num_bad)
    if fraction > max_bad_fraction:
        return (f"{num_bad:,} of {num_good + num_bad:,} rows ({fraction:.2%}) are bad, above "
                f"--max_bad_fraction={max_bad_fraction:g}")
    return None


def _first_bad_rows(plan, count: int = 3) -> str:
    """The first `count` bad rows the workers recorded, as `key (reason)`."""
    found = []
    for worker in range(plan.num_workers):
        part = shard_worker.bad_rows_tmp(plan, worker)
        if tf.io.gfile.exists(part):
            with tf.io.gfile.GFile(part, "r") as f:
                for line in f:
                    row = json.loads(line)
                    found.append(f"{row.get('key')} ({row.get('reason')})")
                    if len(found) >= count:
                        return "; ".join(found)
    return "; ".join(found) or "none recorded"


def _empty_shard(plan, split: str, index: int) -> dict:
    (entry,) = shard_worker.publish(plan, {(split, index): RecordFile(plan.tmp_path(
        plan.file_name(split, index)))}, lambda: True)
    return entry


def _merge_labels(summaries, split: str) -> dict | None:
    merged: dict[str, int] = {}
    for summary in summaries:
        counts = summary["labels"].get(split)
        if counts is None and split in {e["split"] for e in summary["shards"] if e["num_examples"]}:
            return None  # a worker gave up counting (too many distinct values)
        for label, n in (counts or {}).items():
            merged[label] = merged.get(label, 0) + n
    if not merged:
        return None
    return dict(sorted(merged.items(), key=lambda item: int(item[0])))


def _merge_bad_rows(plan, path: str | None, keep: bool = False) -> None:
    """Concatenates the workers' bad-row files into `path` (atomically), removing them; `keep`:
    after the lines `path` already holds (an appended dataset's)."""
    parts = [shard_worker.bad_rows_tmp(plan, w) for w in range(plan.num_workers)]
    if keep and tf.io.gfile.exists(join(plan.output_dir, BAD_ROWS_NAME)):
        parts.insert(0, join(plan.output_dir, BAD_ROWS_NAME))
    if path:
        tmp = plan.tmp_path(BAD_ROWS_NAME)
        with tf.io.gfile.GFile(tmp, "w") as out:
            for part in parts:
                if tf.io.gfile.exists(part):
                    with tf.io.gfile.GFile(part, "r") as f:
                        while chunk := f.read(1 << 20):
                            out.write(chunk)
        tf.io.gfile.rename(tmp, path, overwrite=True)
    for part in parts:
        if not part.endswith("/" + BAD_ROWS_NAME):  # the dataset's own list is not a part to clear
            remove(part, within=plan.output_dir)

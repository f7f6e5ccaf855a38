"""The run directory (`--model_dir`): its layout, who owns it, creation, and small atomic writes.

    params.yaml    the resolved config          summary.json   results of the finished run
    checkpoints/   best weights by a metric     backup/        state for automatic resume
    logs/train, logs/validation  TensorBoard    export/        the SavedModel
    pruned/, quantized/  written by `tftrain prune` and `tftrain quantize`
    .tftrain.json  the marker: a tftrain run    .tftrain-run.lock  one writer at a time
    curves.png, curves.json  the curves per epoch (tftrain.callbacks.curves)
    confusion.png  a classifier's confusion matrix on the test split (tftrain.engine.per_class)

Ownership (see `tftrain.ownership`): a directory is a tftrain run directory when it holds the
run marker (written by `prepare` before anything else) or, for runs of earlier versions, a
params.yaml whose sections are tftrain's config sections. In it, the layout names above are
tftrain's, except export/, pruned/ and quantized/, which must prove it themselves: tftrain
writes a marker into each before anything else (in a run directory without a run marker, an
earlier version's export/ holding saved_model.pb, or pruned/ or quantized/ holding report.json,
count too; `prepare` marks them when it adopts such a directory). Everything else is kept.

One writer at a time: `prepare` takes the run's lock (`dir_lock`) on the chief until `finish`
(or the end of the process), and `lock` holds it for `tftrain prune` and `tftrain quantize`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import posixpath

import tensorflow as tf
from absl import logging

from tftrain import config_schema as config_lib
from tftrain.yaml_file import read_yaml
from tftrain import dir_lock, ownership
from tftrain.errors import ConfigError, TftrainError
from tftrain.fileio import is_local, join, remove, write_json

PARAMS = config_lib.PARAMS
SUMMARY = "summary.json"
CURVES_PNG = "curves.png"  # drawn by tftrain.callbacks.curves
CURVES_JSON = "curves.json"
CONFUSION_PNG = "confusion.png"  # a classifier's test split (tftrain.engine.per_class)
CHECKPOINTS = "checkpoints"
BACKUP = "backup"
TRAINING_SHARDS = "training_shards.json"  # in backup/: the shards the run trains on (data.passes)
LOGS = "logs"
EXPORT = "export"
PRUNED = "pruned"
QUANTIZED = "quantized"
REPORT = "report.json"
KIND = "run"
LOCK = dir_lock.RUN_LOCK

# What `tftrain train` writes, by name, for the error that names a foreign one.
WRITES = {PARAMS: "resolved config", SUMMARY: "summary", CHECKPOINTS: "best checkpoints",
          BACKUP: "backups for resuming", LOGS: "TensorBoard logs", EXPORT: "SavedModel",
          EXPORT + ".tmp": "SavedModel (while saving)", CURVES_PNG: "curves",
          CURVES_JSON: "curves' history", CONFUSION_PNG: "confusion matrix"}
# What an earlier tftrain (no markers) wrote into the directories that must prove they are its own.
_LEGACY_PROOF = {EXPORT: ("saved_model.pb",), PRUNED: (REPORT, "saved_model.pb"),
                 QUANTIZED: (REPORT,)}
_PROVEN = (EXPORT, PRUNED, QUANTIZED, EXPORT + ".tmp", PRUNED + ".tmp")


def new_run_dir(config_name: str, root: str = "runs") -> str:
    """A fresh run directory name under `root`, e.g. runs/digits-20261130-101500."""
    stem = os.path.splitext(os.path.basename(config_name))[0] or "run"
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path, n = join(root, f"{stem}-{stamp}"), 1
    while os.path.exists(path):
        n += 1
        path = join(root, f"{stem}-{stamp}-{n}")
    return path


@dataclasses.dataclass(frozen=True)
class Contents:
    """A model_dir's entries: whether it is a tftrain run directory, its own and foreign entries."""

    directory: str
    is_run: bool
    legacy: bool  # a run directory of an earlier tftrain (no run marker)
    mine: frozenset
    foreign: frozenset


def contents(model_dir: str) -> Contents:
    """Sorts `model_dir`'s entries into tftrain's own and foreign ones (see the module doc)."""
    names = ownership.listing(model_dir)
    marked = ownership.MARKER in names and ownership.marked(model_dir, KIND)
    is_run = marked or (PARAMS in names and _tftrain_params(join(model_dir, PARAMS)))
    mine = {LOCK} | {n for n in names if ownership.own_marker_temp(n)}
    if is_run:
        plain = {PARAMS, SUMMARY, CHECKPOINTS, BACKUP, LOGS, ownership.MARKER, CURVES_PNG,
                 CURVES_JSON, CONFUSION_PNG}
        mine |= plain | {n for n in names if any(n.startswith(f"{p}.tmp-") for p in plain)}
        mine |= {n for n in _PROVEN if n in names and replaceable(join(model_dir, n), not marked)}
    mine = ownership.without_links(model_dir, mine & names)
    return Contents(model_dir, is_run, is_run and not marked, frozenset(mine),
                    frozenset(names - mine))


def _tftrain_params(path: str) -> bool:
    """True for a params.yaml written by tftrain: a mapping of tftrain's config sections."""
    try:
        sections = read_yaml(path)
    except (ConfigError, OSError, tf.errors.OpError):
        return False
    known = {field.name for field in dataclasses.fields(config_lib.Config)}
    return bool(sections) and set(sections) <= known


def replaceable(path: str, legacy: bool | None = None) -> bool:
    """True when tftrain may replace or write into `path` (export/, pruned/, quantized/ or the
    temporary directory of a save): absent, empty, or proven tftrain's (see the module doc).
    `legacy`: whether the run directory is an earlier version's (default: look)."""
    parent, name = posixpath.split(path.rstrip("/"))
    if legacy is None:
        legacy = not ownership.marked(parent, KIND)
    proof = _LEGACY_PROOF.get(name.removesuffix(".tmp"), ()) if legacy else ()
    return ownership.replaceable(path, proof)


def check_replaceable(path: str) -> None:
    """Raises unless tftrain may replace or write into `path` (see `replaceable`)."""
    if not replaceable(path):
        raise TftrainError(
            f"{path} was not written by tftrain (it holds no {ownership.MARKER}), and tftrain "
            "does not replace what it did not write; move it away and run the command again.")


def mark_output(path: str) -> None:
    """Creates the directory `path` with tftrain's marker (first, so that even a save killed
    midway leaves a directory that is provably tftrain's)."""
    ownership.mark(path, posixpath.basename(path.rstrip("/")).removesuffix(".tmp"))


def prepare(model_dir: str, overwrite: bool, params_yaml: str | None = None, *,
            chief: bool = True) -> None:
    """Creates `model_dir` and claims it for one training run.

    Refused: a finished run (summary.json) unless `overwrite`, which then removes only
    tftrain's own entries; a non-empty directory that is not a tftrain run directory unless
    `overwrite` (then the run writes beside what is there, which is kept); and always, an entry
    the run would write under a name tftrain did not write. An unfinished run is left as it is,
    so training resumes from its backup; when `params_yaml` differs from the params.yaml it was
    started with, a warning says so.

    The chief takes the run's lock (held until `finish` or the end of the process, so a second
    `tftrain train` into the same directory stops at once) and writes the run marker; the other
    workers of a multi-worker run only check (they write nothing here).
    """
    _check(contents(model_dir), overwrite)  # before writing anything into someone else's directory
    if not chief:
        tf.io.gfile.makedirs(model_dir)
        return
    tf.io.gfile.makedirs(model_dir)
    dir_lock.acquire(model_dir, LOCK, "tftrain train")
    try:
        found = contents(model_dir)  # again, under the lock: another run may have finished
        _check(found, overwrite)
        _claim(found)
    except BaseException:
        dir_lock.release(model_dir, LOCK)
        raise
    if params_yaml is not None and SUMMARY not in found.mine and {BACKUP, PARAMS} <= found.mine:
        with tf.io.gfile.GFile(join(model_dir, PARAMS)) as f:
            if f.read() != params_yaml:
                logging.warning("%s holds an unfinished run started with another config (%s); "
                                "resuming it with the new one", model_dir, PARAMS)


def check(model_dir: str, overwrite: bool) -> None:
    """Raises for what `prepare` would refuse in `model_dir`, writing nothing: `train` checks
    first, and claims (creates) the directory only once its config is valid."""
    _check(contents(model_dir), overwrite)


# What a run directory holds once claimed, before its run has written anything of its own.
CLAIM = frozenset({PARAMS, ownership.MARKER, LOCK})


def discard_unused(model_dir: str) -> bool:
    """Removes `model_dir`, which this process created, when it holds nothing but a run's claim
    (`CLAIM`: its run stopped before writing anything, e.g. on a refused config); the lock must
    be released first. Returns whether it was removed."""
    names = ownership.listing(model_dir)
    if not names or not names <= CLAIM:
        return False
    for name in names:
        remove(join(model_dir, name), within=model_dir)
    if is_local(model_dir):  # an object store has no empty directories to remove
        os.rmdir(model_dir)
    logging.info("removed %s: the run stopped before writing anything into it", model_dir)
    return True


def _check(found: Contents, overwrite: bool) -> None:
    """Raises for what `prepare` refuses (see there)."""
    if SUMMARY in found.mine and not overwrite:
        raise TftrainError(
            f"{found.directory} holds a finished run ({SUMMARY} exists); nothing to do. Pass "
            "--overwrite to train it again from scratch, or choose another --model_dir")
    if found.foreign and not found.is_run and not overwrite:
        raise TftrainError(
            f"{found.directory} is not a tftrain run directory: it holds "
            f"{ownership.describe(found.foreign)} that tftrain did not write. Choose a new or "
            "empty --model_dir, or pass --overwrite to train into it beside them (they are kept).")
    taken = sorted(found.foreign & set(WRITES))
    if taken:
        raise TftrainError(
            f"{join(found.directory, taken[0])} was not written by tftrain, and training writes "
            f"its {WRITES[taken[0]]} there; tftrain does not replace what it did not write. Move "
            "it away, or choose another --model_dir.")


def _claim(found: Contents) -> None:
    """Clears a finished run's own entries (retraining with --overwrite) and marks the directory."""
    model_dir = found.directory
    if SUMMARY in found.mine:
        # summary.json goes first: from here on the directory is not a finished run.
        for name in [SUMMARY, *sorted(found.mine - {SUMMARY, LOCK, ownership.MARKER})]:
            remove(join(model_dir, name), within=model_dir)
        if found.foreign:
            logging.info("kept in %s (not written by tftrain): %s", model_dir,
                         ownership.describe(found.foreign))
    elif found.legacy:  # adopting an earlier version's run: its proven outputs get markers too
        for name in sorted(found.mine & set(_PROVEN)):
            mark_output(join(model_dir, name))
    if not ownership.marked(model_dir, KIND):
        ownership.mark(model_dir, KIND)


@contextlib.contextmanager
def lock(model_dir: str, command: str, chief: bool = True):
    """Holds the run's lock for `command` (e.g. "tftrain prune") on the chief; other workers of
    a multi-worker job take no lock (the chief holds it for them)."""
    if not chief:
        yield
        return
    with dir_lock.exclusive(model_dir, LOCK, command):
        yield


def finish(model_dir: str, summary: dict) -> None:
    """Writes summary.json, which marks the run finished, deletes its backup, releases the lock."""
    write_json(join(model_dir, SUMMARY), summary)
    remove(join(model_dir, BACKUP), within=model_dir)
    release(model_dir)


def release(model_dir: str) -> None:
    """Releases the run's lock if this process holds it (`prepare` took it)."""
    dir_lock.release(model_dir, LOCK)

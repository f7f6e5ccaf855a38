"""What tftrain wrote, and so may delete or replace: one place for "is this mine".

tftrain never deletes or overwrites what it cannot prove it wrote. The proofs:

- A dataset directory (`tftrain convert --output`, `dataset_contents`): the files its
  tftrain `dataset.json` lists (a complete dataset); the files listed by the conversion marker
  `.tftrain-convert.json` (written before the first shard: the run id, the converter's pid and
  every name the conversion writes or takes over), the temporary files carrying that run id
  (`.<name>.tmp-<run id>`, `temp_name`), a shard named by such a temporary claim
  (`.<shard>.claim.tmp-<run id>`, written before a shard of a split the plan did not foresee is
  published), and the lock file. The marker is removed once dataset.json is written.
- A run directory (`--model_dir`): see `tftrain.run_dir`, which knows its layout; it builds on
  `MARKER`, a `.tftrain.json` file that tftrain writes into every directory it creates for a
  run (the run directory itself, export/, pruned/, quantized/) before anything else, and on
  `replaceable` for export/, pruned/ and quantized/.

Everything else is foreign: it is kept, and a file tftrain would write under a foreign name
stops the command with an error naming it. A marker or manifest is a claim anyone can write, so
a name it lists is tftrain's only when it is a regular file with the shape of tftrain's own
names; and tftrain never creates a symbolic link, so a link is never its own. What is proven
tftrain's is removed by `fileio.remove`, which never follows a link or leaves the directory.
"""
from __future__ import annotations

import dataclasses
import os
import re
import socket

import tensorflow as tf

import tftrain
from tftrain import dir_lock
from tftrain.data import manifest as manifest_lib
from tftrain.errors import DataError
from tftrain.fileio import is_regular_file, is_symlink, join, read_json, write_json

MARKER = ".tftrain.json"
CONVERT_MARKER = ".tftrain-convert.json"
CONVERT_FORMAT = "tftrain.convert/1"
CLAIM_SUFFIX = ".claim"
# The names tftrain gives the files of a dataset directory (besides dataset.json, bad_rows.jsonl
# and the lock): shards (`manifest.shard_name`) and temporary files (`.<name>.tmp-<run id>`,
# `<name>.tmp-<pid>` of `fileio.write_atomic`).
_OWN_DATASET_FILE = re.compile(
    r"[^/\\.][^/\\]*-\d{5,}-of-\d{5,}\.tfrecord|\.[^/\\]+\.tmp-[\w.-]+|[^/\\]+\.tmp-\d+")
_DATASET_FILES = {manifest_lib.MANIFEST_NAME, manifest_lib.BAD_ROWS_NAME, dir_lock.CONVERT_LOCK,
                  CONVERT_MARKER, *manifest_lib.ASSET_NAMES}


def listing(directory: str) -> set[str]:
    """The names in `directory` (none if it does not exist)."""
    if not tf.io.gfile.isdir(directory):
        return set()
    return {name.rstrip("/") for name in tf.io.gfile.listdir(directory)}


def describe(names, limit: int = 3) -> str:
    """A few of `names` and their count: 'a, b, c and 5 more (8 entries)'."""
    shown = sorted(names)[:limit]
    more = len(names) - len(shown)
    count = f"{len(names)} entr{'y' if len(names) == 1 else 'ies'}"
    return ", ".join(shown) + (f" and {more} more" if more else "") + f" ({count})"


def temp_name(name: str, run_id: str) -> str:
    """The temporary name under which a run writes the file `name` (renamed when complete)."""
    return f".{name}.tmp-{run_id}"


def _is_temp_of(name: str, stem: str) -> bool:
    """True for `stem.tmp-<n>`, the temporary file of `fileio.write_atomic`."""
    return name.startswith(stem + ".tmp-")


# ---- directories tftrain creates whole (run dirs, export/, pruned/, quantized/) -------------

def mark(directory: str, kind: str) -> None:
    """Creates `directory` if needed and writes tftrain's marker into it."""
    tf.io.gfile.makedirs(directory)
    write_json(join(directory, MARKER), {"written_by": "tftrain", "kind": kind,
                                         "tool_version": tftrain.__version__})


def marked(directory: str, kind: str) -> bool:
    """True when `directory` holds tftrain's marker of `kind`."""
    path = join(directory, MARKER)
    try:
        return tf.io.gfile.exists(path) and read_json(path).get("kind") == kind
    except (ValueError, AttributeError, tf.errors.OpError):
        return False


def own_marker_temp(name: str) -> bool:
    """True for a temporary file left by writing a marker (`fileio.write_atomic`)."""
    return _is_temp_of(name, MARKER) or _is_temp_of(name, CONVERT_MARKER)


def replaceable(path: str, legacy_files=()) -> bool:
    """True when tftrain may replace the directory `path`: it is absent or empty, holds
    tftrain's marker, or holds one of `legacy_files` (what an earlier tftrain, which wrote no
    markers, wrote into it). A directory holding only the temporary file of its marker is one
    that tftrain was killed creating (between `makedirs` and the marker's rename)."""
    if not tf.io.gfile.exists(path):
        return True
    if not tf.io.gfile.isdir(path):
        return False
    names = {name for name in listing(path) if not own_marker_temp(name)}
    return not names or MARKER in names or bool(names & set(legacy_files))


# ---- dataset directories -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DatasetContents:
    """A dataset directory's entries, split into tftrain's own and the rest."""

    directory: str
    mine: frozenset
    foreign: frozenset
    manifest: dict | None  # a tftrain dataset.json, when there is one

    def listed(self) -> set[str]:
        """The files of the complete dataset (its manifest and what it lists)."""
        return _manifest_files(self.manifest) if self.manifest else set()


def dataset_contents(output_dir: str) -> DatasetContents:
    """Sorts `output_dir`'s entries into tftrain's own and foreign ones (see the module doc)."""
    names = listing(output_dir)
    manifest = _tftrain_manifest(output_dir) if manifest_lib.MANIFEST_NAME in names else None
    mine = {dir_lock.CONVERT_LOCK, CONVERT_MARKER} | {n for n in names if own_marker_temp(n)}
    if manifest:
        mine |= _manifest_files(manifest)
    if CONVERT_MARKER in names:
        mine |= _claimed_by_marker(output_dir, names)
    mine = {name for name in mine & names if _own_dataset_file(output_dir, name)}
    return DatasetContents(output_dir, frozenset(mine), frozenset(names - mine), manifest)


def _own_dataset_file(output_dir: str, name: str) -> bool:
    """A marker or a manifest is a claim anyone can write: a name it lists is tftrain's only if
    it also has the shape tftrain gives its files and is a regular file (no link, no folder)."""
    shaped = name in _DATASET_FILES or bool(_OWN_DATASET_FILE.fullmatch(name))
    return shaped and is_regular_file(join(output_dir, name))


def without_links(directory: str, names) -> set[str]:
    """`names` less those that are symbolic links in `directory`: tftrain never creates a link,
    so a link is never its own (and nothing is written or removed through one)."""
    return {name for name in names if not is_symlink(join(directory, name))}


def write_convert_marker(output_dir: str, run_id: str, files) -> None:
    """Writes the conversion marker: this run's id and pid, and the names it owns."""
    write_json(join(output_dir, CONVERT_MARKER), {
        "format": CONVERT_FORMAT, "run_id": run_id, "pid": os.getpid(),
        "host": socket.gethostname(), "files": sorted(files)})


def _tftrain_manifest(output_dir: str) -> dict | None:
    try:
        return manifest_lib.read(output_dir)
    except DataError:
        return None  # not tftrain's (or unreadable): its dataset.json is foreign


def _manifest_files(manifest: dict) -> set[str]:
    files = {manifest_lib.MANIFEST_NAME}
    for split in manifest.get("splits", {}).values():
        files |= {shard["file"] for shard in split.get("shards", [])}
    files |= {asset["file"] for asset in manifest.get("assets", [])}
    bad_rows = manifest.get("bad_rows", {}).get("file")
    return files | ({bad_rows} if bad_rows else set())


def _claimed_by_marker(output_dir: str, names: set[str]) -> set[str]:
    """The names an (interrupted or running) conversion's marker proves to be its own."""
    try:
        marker = read_json(join(output_dir, CONVERT_MARKER))
        run_id, pid, files = marker["run_id"], marker["pid"], marker["files"]
    except (ValueError, KeyError, TypeError, tf.errors.OpError):
        return set()
    owned = set(files) | {f"{manifest_lib.MANIFEST_NAME}.tmp-{pid}"}
    suffix = f".tmp-{run_id}"
    claim = CLAIM_SUFFIX + suffix
    for name in names:
        if name.startswith(".") and (name.endswith(suffix) or f"{suffix}.tmp-" in name):
            owned.add(name)
            if name.endswith(claim):
                owned.add(name[1:-len(claim)])
    return owned

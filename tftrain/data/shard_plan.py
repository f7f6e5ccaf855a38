"""How many shards each split gets, which worker owns which shard, and where a row goes.

Ownership: with W workers, shard j of a split (of S, S >= W) belongs to worker j % W. Worker w
reads its own share of the rows (`pipeline.read(source, info, w, W)`) and places each row in one
of its own shards, chosen from a hash of the row's key and the seed. So no example crosses a
process, and for a given source, worker count, shard counts and seed the output is identical
on every run. Invariant across worker counts: which split each row is in, and so each split's
set of examples and its size. Not invariant: which shard (and position) an example lands in.

Shard counts come from `--num_shards`, or from an estimate of each split's encoded size divided
by the target shard size (`--shard_size_mb`, default 150 MB), rounded to a multiple of W.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import posixpath

from tftrain import ownership
from tftrain.data import example_bytes, processes
from tftrain.data import manifest as manifest_lib
from tftrain.data.splits import assign_shard, split_of
from tftrain.data.shard_worker import RowFailed
from tftrain.errors import BadRow, ConfigError, DataError

MB = 1 << 20
DEFAULT_SHARD_MB = 150
SAMPLE_ROWS = processes.SMALL_SOURCE_ROWS  # rows read (not encoded): is the source small?
SAMPLE_ENCODE = 64      # rows encoded to measure the size of an example
STAT_FILES = 2_000  # sizing a source folder: stat this many files, extrapolate the rest


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """Everything a worker needs to place rows; picklable, identical in every worker."""

    output_dir: str
    run_id: str
    num_workers: int
    seed: int
    shards: dict  # split -> number of shards, for the splits foreseen
    default_shards: int  # for a split that shows up without being foreseen
    fractions: dict | None  # --splits: re-split every row by its key
    default_fractions: dict  # for rows without a source split
    generation: int = 0  # the n-th `convert --append` into the dataset (0: a new dataset)

    def split_of(self, row) -> str:
        """The split of a row: its source split, unless --splits re-splits everything."""
        return split_of(row.split_key or row.key, row.split, self.fractions,
                        self.default_fractions)

    def num_shards(self, split: str) -> int:
        """The number of shards of `split`."""
        return self.shards.get(split, self.default_shards)

    def owned(self, split: str, worker: int) -> range:
        """The shard indices of `split` that `worker` writes."""
        return range(worker, self.num_shards(split), self.num_workers)

    def shard_of(self, key: str, split: str, worker: int) -> int:
        """The shard (global index) of a row read by `worker`."""
        owned = self.owned(split, worker)
        return owned[assign_shard(key, len(owned), self.seed)]

    def file_name(self, split: str, index: int) -> str:
        """The final file name of a shard."""
        return manifest_lib.shard_name(split, index, self.num_shards(split), self.generation)

    def tmp_path(self, name: str) -> str:
        """This run's temporary path for the file `name` (renamed when complete)."""
        return posixpath.join(self.output_dir, ownership.temp_name(name, self.run_id))

    def foresees(self, split: str) -> bool:
        """True for a split sized in advance: its shard names are in the conversion marker."""
        return split in self.shards

    def file_names(self) -> list[str]:
        """The names of the shards of the splits foreseen (see `foresees`)."""
        return [self.file_name(split, index) for split, count in sorted(self.shards.items())
                for index in range(count)]

    def claim_path(self, name: str) -> str:
        """The file that claims the shard `name` of an unforeseen split for this run (written
        before the shard is published, so that a rerun after a kill knows it is its own)."""
        return self.tmp_path(name + ownership.CLAIM_SUFFIX)


@dataclasses.dataclass
class Sample:
    """A first look at the rows: how many (when few), per split, and the size of an example."""

    rows: int = 0
    source_splits: bool = False  # some rows carry a split of their own
    exhausted: bool = False  # the whole source was read: the counts are exact
    split_rows: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    encoded_rows: int = 0
    encoded_bytes: int = 0
    bad_reasons: list = dataclasses.field(default_factory=list)

    @property
    def example_bytes(self) -> float:
        """Mean serialized size of an example (bytes), 0 when nothing could be encoded."""
        return self.encoded_bytes / self.encoded_rows if self.encoded_rows else 0.0


def take_sample(pipeline, source: str, info: dict, split_of) -> Sample:
    """Reads up to SAMPLE_ROWS rows of the source and encodes the first SAMPLE_ENCODE of them."""
    sample = Sample()
    rows = pipeline.read(source, info, 0, 1)
    try:
        for row in itertools.islice(rows, SAMPLE_ROWS + 1):
            if sample.rows == SAMPLE_ROWS:
                return sample
            sample.rows += 1
            sample.source_splits |= bool(row.split)
            sample.split_rows[split_of(row)] += 1
            if sample.encoded_rows + len(sample.bad_reasons) < SAMPLE_ENCODE:
                try:
                    if isinstance(row.value, BadRow):
                        raise row.value
                    sample.encoded_bytes += len(example_bytes.serialize(pipeline.encode(row, info)))
                    sample.encoded_rows += 1
                except BadRow as e:
                    sample.bad_reasons.append(f"{row.key}: {e}")
                except Exception as e:
                    raise DataError(f"pipeline {pipeline.name!r} failed: "
                                    f"{RowFailed(row.key, e)}") from e
        sample.exhausted = True
        return sample
    finally:
        close = getattr(rows, "close", None)
        if close:
            close()


def source_bytes(source: str) -> dict | None:
    """The input's size in bytes per source split (None: whole input), or None if not a path.

    A directory whose top-level entries are all named after splits (`train/`, `test.csv`) is
    measured per split (see `_tree_bytes`).
    """
    import tensorflow as tf

    from pipelines.sources import split_from_name

    if not source:
        return None
    try:
        if any(c in source for c in "*?["):
            paths = tf.io.gfile.glob(source)
            return {None: sum(_tree_bytes(p) for p in paths)} if paths else None
        if not tf.io.gfile.exists(source):
            return None
        if not tf.io.gfile.isdir(source):
            return {None: tf.io.gfile.stat(source).length}
        entries = [n.rstrip("/") for n in tf.io.gfile.listdir(source) if not n.startswith(".")]
        splits = {name: split_from_name(name) for name in entries}
        if entries and all(splits.values()):
            sizes = collections.Counter()
            for name, split in splits.items():
                sizes[split] += _tree_bytes(posixpath.join(source, name))
            return dict(sizes)
        return {None: _tree_bytes(source)}
    except (OSError, tf.errors.OpError):
        return None


def _tree_bytes(path: str) -> int:
    """The size of a file, or of the files under a directory: stat'ing at most STAT_FILES of
    them, spread evenly over the listing, and extrapolating (the shard count needs no more)."""
    import tensorflow as tf

    local = "://" not in path
    if not (os.path.isdir(path) if local else tf.io.gfile.isdir(path)):
        return os.path.getsize(path) if local else tf.io.gfile.stat(path).length
    walk = os.walk(path) if local else tf.io.gfile.walk(path)
    files = [posixpath.join(d, f) for d, _, names in walk for f in names if not f.startswith(".")]
    measured = files[::-(-len(files) // STAT_FILES)] if files else []
    size = os.path.getsize if local else (lambda f: tf.io.gfile.stat(f).length)
    return round(sum(map(size, measured)) / max(len(measured), 1) * len(files))


def shards_for(nbytes: float, target_mb: float, workers: int) -> int:
    """Shards for `nbytes` of examples: about `target_mb` each, a multiple of `workers`."""
    raw = max(1, round(nbytes / (target_mb * MB)))
    return max(workers, workers * round(raw / workers))


def check_args(*, num_shards=None, shard_size_mb=None, workers=None, max_bad_fraction=0.0) -> None:
    """Raises ConfigError for a bad combination of writer arguments (before any file is touched)."""
    if num_shards is not None and shard_size_mb is not None:
        raise ConfigError("pass either --num_shards or --shard_size_mb, not both.")
    if num_shards is not None and num_shards < 1:
        raise ConfigError(f"--num_shards={num_shards} must be at least 1.")
    if shard_size_mb is not None and shard_size_mb <= 0:
        raise ConfigError(f"--shard_size_mb={shard_size_mb} must be positive.")
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers={workers} must be at least 1 (or 0 for all cores).")
    if not 0 <= max_bad_fraction <= 1:
        raise ConfigError(f"--max_bad_fraction={max_bad_fraction} must be between 0 and 1.")


def choose(*, sample: Sample, sizes: dict | None, fractions: dict | None, default_fractions: dict,
           workers: int | None, num_shards: int | None, shard_size_mb: float | None) -> tuple:
    """Returns (num_workers, {split: shards}, default_shards, estimated_rows, notes).

    `workers=None` means all cores, or 1 when the source is small (read whole in the sample).
    """
    check_args(num_shards=num_shards, shard_size_mb=shard_size_mb, workers=workers)
    notes = []
    if workers is None:
        workers = 1 if sample.exhausted else (os.cpu_count() or 1)
    if num_shards is not None and num_shards < workers:
        notes.append(f"using {num_shards} worker(s): each worker writes its own shards and "
                     f"--num_shards={num_shards} < --workers={workers}")
        workers = num_shards
    elif num_shards is not None and num_shards % workers:
        notes.append(f"--num_shards={num_shards} is not a multiple of {workers} workers: shards of "
                     "different workers will differ in size")

    if fractions or not sample.source_splits:
        shares = fractions or default_fractions
        splits = set(shares)
    else:
        shares = None
        splits = set(sample.split_rows) | set(s for s in (sizes or {}) if s)
    if sample.exhausted:
        estimated_rows = sample.rows
        split_bytes = {s: n * sample.example_bytes for s, n in sample.split_rows.items()}
        total_bytes = sum(split_bytes.values())
    else:
        total_bytes = sum(sizes.values()) if sizes else None
        estimated_rows = (int(total_bytes / sample.example_bytes)
                          if total_bytes and sample.example_bytes else None)
        if total_bytes is None:
            split_bytes, total_bytes = {}, 0
            if num_shards is None:
                notes.append("the input's size is unknown: writing one shard per worker and split "
                             "(pass --num_shards or --shard_size_mb to choose)")
        elif shares:
            split_bytes = {s: total_bytes * f for s, f in shares.items()}
        else:  # source splits: sized from the input's split folders/files when they are named
            # so, else in the sample's proportions (a pipeline that splits its rows itself)
            split_bytes = {s: n for s, n in (sizes or {}).items() if s} or {
                s: total_bytes * n / max(1, sample.rows) for s, n in sample.split_rows.items()}
    target = shard_size_mb or DEFAULT_SHARD_MB
    if num_shards is not None:
        shards = {s: num_shards for s in splits}
        default = num_shards
    else:
        shards = {s: shards_for(split_bytes.get(s, total_bytes), target, workers) for s in splits}
        default = shards_for(total_bytes, target, workers)
    return workers, shards, default, estimated_rows, notes

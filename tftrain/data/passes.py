"""Which shards a run's training passes read, so that a dataset may grow under a stopped run.

A run records in `backup/training_shards.json` the training split's shards it started on and
the examples its step plan was made from. When a stopped run resumes and the dataset has grown
(`tftrain convert --append`), the grown set of shards is added from the step it resumes at:
the run finishes the pass it was in on the shards it had and reads the grown split from its
next pass on (`tftrain.data.order`), while its step plan stays the one it started with. A
shard the run read that is no longer in the dataset is refused: nothing could resume exactly.
The record goes with the backup (deleted when the run finishes).
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf
from absl import logging

from tftrain import run_dir
from tftrain.config_schema import DataConfig
from tftrain.data import manifest as manifest_lib
from tftrain.errors import DataError
from tftrain.fileio import join, read_json, write_json

AFRESH = "another --model_dir, or delete the run's backup/ directory"


@dataclasses.dataclass(frozen=True)
class TrainingShards:
    """The shards a run trains on: `sets` of `(from_step, shard names)`, the first from step 0
    (see `reader.load`'s `shard_sets`); `examples`: what its step plan was made from."""

    split: str
    examples: int
    sets: tuple[tuple[int, tuple[str, ...]], ...]

    def to_json(self) -> dict:
        """The record's JSON object."""
        return {"split": self.split, "examples": self.examples,
                "sets": [{"from_step": step, "shards": list(names)} for step, names in self.sets]}


def recorded(backup_dir: str) -> TrainingShards | None:
    """The record in `backup_dir`, or None without one; DataError for one tftrain cannot read."""
    path = join(backup_dir, run_dir.TRAINING_SHARDS)
    if not tf.io.gfile.exists(path):
        return None
    try:
        data = read_json(path)
        sets = tuple((int(entry["from_step"]), tuple(str(name) for name in entry["shards"]))
                     for entry in data["sets"])
        shards = TrainingShards(str(data["split"]), int(data["examples"]), sets)
        if not sets or sets[0][0] != 0 or any(not names for _, names in sets):
            raise ValueError("its first set does not start at step 0, or a set is empty")
    except (ValueError, KeyError, TypeError) as error:
        raise DataError(f"{path} is not a record of the shards this run trained on ({error}); "
                        f"start the run afresh: {AFRESH}.") from error
    return shards


def resumed(previous: TrainingShards | None, manifest: dict, split: str, data_dir: str,
            start_step: int) -> TrainingShards:
    """The run's shards when it starts (or resumes) at `start_step`: the split as it is now for
    a new run; for a resumed one, its record, grown by the split's new shards from
    `start_step` on. Raises DataError when a shard it read is gone or it trained another split."""
    current = tuple(shard.file for shard in manifest_lib.typed(manifest).splits[split].shards)
    if previous is None or start_step == 0:
        return TrainingShards(split, manifest_lib.typed(manifest).examples(split), ((0, current),))
    if previous.split != split:
        raise DataError(f"this run trained on split {previous.split!r} and now asks for {split!r} "
                        f"of {data_dir}; resume it with data.train_split={previous.split}, or "
                        f"start it afresh: {AFRESH}.")
    kept = tuple(entry for entry in previous.sets if entry[0] < start_step)
    read_before = {name for _, names in kept for name in names}
    gone = sorted(read_before - set(current))
    if gone:
        raise DataError(f"shard {gone[0]} of split {split!r}, which this run trained on, is no "
                        f"longer in {data_dir}: it cannot resume on the data it started with. "
                        f"Restore the dataset, or start the run afresh: {AFRESH}.")
    if current == kept[-1][1]:
        return dataclasses.replace(previous, sets=kept)
    logging.info("split %r of %s grew to %d shards since this run stopped: it finishes the pass "
                 "it is in on the %d shards it had and reads all %d from its next pass; its step "
                 "plan (over %d examples) is kept", split, data_dir, len(current),
                 len(kept[-1][1]), len(current), previous.examples)
    return dataclasses.replace(previous, sets=kept + ((start_step, current),))


def for_run(backup_dir: str, previous: TrainingShards | None, data: DataConfig, manifest: dict,
            start_step: int, chief: bool) -> tuple:
    """The training input's `shard_sets` for a run starting at `start_step` after `previous`
    (see `resumed`), recorded by the chief; () for other tools' TFRecords (read as they are)."""
    if data.format == "tfrecord":
        return ()
    shards = resumed(previous, manifest, data.train_split, data.dir, start_step)
    if chief:
        tf.io.gfile.makedirs(backup_dir)
        write_json(join(backup_dir, run_dir.TRAINING_SHARDS), shards.to_json())
    return shards.sets

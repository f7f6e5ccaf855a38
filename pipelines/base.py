"""The contract every dataset kind implements.

A pipeline says how raw rows are read, what features the stored `tf.train.Example`s have
(the schema, saved in the dataset's manifest), how one row is encoded, and how a *batch* of
parsed features is decoded into `(inputs, label)` for training. The converter (`tftrain
convert`) calls `prepare`, `read`, `features` and `encode`; the reader (`tftrain.data.load`)
calls `decode`. Nothing here imports TensorFlow at module level, so a pipeline can be listed
and configured without starting it.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, Iterator


@dataclasses.dataclass(frozen=True)
class Row:
    """One raw row: a key that identifies it in its source, its value, and its source split.

    `key` must be stable (a file path relative to the source, a line number, an index): split
    assignment and shard placement are derived from it, so the same row lands in the same place
    on every run, and adding rows does not move the others between splits.
    """

    key: str
    value: Any
    split: str | None = None
    # The key its split is drawn from when it is not `key` (a window of packed text draws the
    # split of the passage it was cut from, also under --splits).
    split_key: str | None = None


class BasePipeline(abc.ABC):
    """Base class for `pipelines.<kind>.Pipeline`. Options come from the command line/config."""

    name = "base"
    # Fractions used when the source has no splits of its own and none are asked for.
    default_splits: dict[str, float] = {"train": 1.0}
    # The fractions of a `--splits` re-split, set by the converter before `prepare` (None: none).
    requested_splits: dict[str, float] | None = None

    def __init__(self, **options):
        self.options = options
        # Files kept beside the shards (name in manifest.ASSET_NAMES -> bytes): set by `prepare`
        # when it makes one (a tokenizer model), or loaded from a dataset by `load_assets`.
        self.assets: dict[str, bytes] = {}

    def load_assets(self, data_dir: str, manifest: dict) -> None:
        """Loads the assets of the dataset in `data_dir` (each checked against its hash)."""
        from tftrain.data import manifest as manifest_lib

        self.assets = manifest_lib.read_assets(data_dir, manifest)

    def known_num_rows(self, source: str) -> int | None:
        """How many rows `source` holds when that is known without reading it, else None.

        An embedded dataset knows. The converter writes a source known to be small in its own
        process, without starting the worker processes (each would import TensorFlow for nothing).
        """
        return None

    def split_of(self, key: str, source_split: str | None) -> str:
        """The split the converter puts a row in (see `requested_splits`): for a `prepare` that
        learns from the training rows only, such as a vocabulary."""
        from tftrain.data.splits import split_of

        return split_of(key, source_split, self.requested_splits, self.default_splits)

    def prepare(self, source: str) -> dict:
        """One look at the source before rows are read (class names, vocabulary, ...).

        Returns JSON-serializable metadata, stored as `info` in the manifest and handed to every
        other method. It should hold `num_classes` for classification datasets.
        """
        return {}

    @abc.abstractmethod
    def read(self, source: str, info: dict, worker: int = 0, num_workers: int = 1) -> Iterator[Row]:
        """Yields this worker's share of the source's rows (a disjoint, deterministic share).

        Must stream: never hold the whole source in memory.
        """

    @abc.abstractmethod
    def features(self, info: dict) -> dict[str, dict]:
        """The schema: feature name -> {"dtype": "string"|"int64"|"float32", "shape": [...]}.

        A feature with `"varlen": true` is parsed as variable length (padded per batch).
        """

    @abc.abstractmethod
    def encode(self, row: Row, info: dict):
        """Returns the row as a `tf.train.Example` or its serialized bytes; raises `BadRow(reason)`.

        Bytes built with `tftrain.data.example_bytes` are ~3x cheaper than protobuf objects,
        which matters when a conversion handles millions of small rows.
        """

    @abc.abstractmethod
    def decode(self, features: dict, info: dict):
        """Decodes a batch of parsed features (a dict of batched tensors) to `(inputs, label)`."""

    def image_shape(self, info: dict) -> tuple[int, int, int] | None:
        """`(height, width, channels)` of the images `decode` yields when it is an image
        pipeline's (its decode is `pipelines.images.decode_image_batch`, which `data.augment`
        needs), else None."""
        return None

    def predict_rows(self, source: str, info: dict) -> Iterator[tuple[Row, dict]]:
        """For `tftrain predict`: yields each raw row of `source` (a file, a folder, a glob; `-`,
        standard input, where the pipeline reads lines) in the source's order, streaming, as
        `encode` takes it with a stand-in label (the model's inputs do not read it), and the
        row's fields to pass through to the output (an `id` column; {} for none). A row that
        cannot be read is yielded too, as a value `encode` refuses with `BadRow`, so that it
        gets its output row. Raises ConfigError when `source` holds another kind of input than
        the pipeline reads (`sources.predict_files` names both)."""
        from tftrain.errors import ConfigError

        raise ConfigError(f"pipeline {self.name!r} has no reader of raw files for tftrain "
                          "predict: predict on its converted records instead (--data=DIR "
                          "--split=NAME)")

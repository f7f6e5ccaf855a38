"""Language modeling on plain text: `.txt` files (one file, a glob or a directory), or, with no
`--input`, the embedded default: Python's own documentation (`pydoc_data.topics`, part of every
Python's standard library; ~465k characters, no network).

Tokens are characters. `prepare` counts the characters of the whole source and keeps the
`vocab_size - 2` most frequent ones (ties broken by code point) as the vocabulary, stored in the
manifest's `info` (`vocabulary`, `vocab_size`, `sequence_length`): id 0 is padding, id 1 stands
for a character outside the vocabulary, characters from 2. A character vocabulary (and not a
word one, e.g. `TextVectorization`'s default standardize-and-split) because it is lossless: the
text a model generates is printed exactly, with its case, punctuation, indentation and
newlines, and no prompt has out-of-vocabulary words; it is also small (~100 ids), which keeps
the model small enough for a CPU. It is the vocabulary
`tf_keras.layers.TextVectorization(split="character", standardize=None)` adapts to (the tests
check it), computed here with one streaming pass in Python instead of a TensorFlow one.

The text is cut into consecutive, non-overlapping windows of `sequence_length + 1` token ids
(the stored feature `tokens`); `decode` returns `(ids[:, :-1], ids[:, 1:])`: the model reads
the first `sequence_length` tokens and predicts each next one. A file's last partial window is
dropped; each file's windows start at its beginning.

Splits: files named `train*.txt`, `validation*.txt`, `test*.txt` keep those splits. Otherwise
consecutive windows are grouped into blocks of `block_windows` windows, and each block goes to
one split (a hash of its position; `default_splits` fractions), so validation and test text
comes in contiguous passages that no training window contains. `tftrain convert --splits=...`
re-splits window by window (windows still never overlap).

Options: sequence_length (64), vocab_size (256, including the padding and out-of-vocabulary
ids), block_windows (16).
Bad rows: a line that is not valid UTF-8 (its key is `FILE:line N`; the line is left out of the
text).
"""
from __future__ import annotations

import posixpath
from collections import Counter

from pipelines.base import BasePipeline, Row
from pipelines.options import check_known, get_int
from pipelines.sources import list_files, source_splits
from tftrain.data import example_bytes
from tftrain.data.splits import assign_split
from tftrain.errors import BadRow, ConfigError

OPTIONS = ("sequence_length", "vocab_size", "block_windows")
EXTENSIONS = (".txt",)
EMBEDDED = "pydoc_data.topics"
PAD_ID, OOV_ID, FIRST_TOKEN_ID = 0, 1, 2
TOKENIZER = "characters"


def embedded_text() -> str:
    """The embedded default: every topic of Python's documentation, in topic-name order."""
    from pydoc_data import topics

    return "\n\n".join(topics.topics[name].strip("\n") for name in sorted(topics.topics)) + "\n"


def build_vocabulary(counts: Counter, vocab_size: int) -> list[str]:
    """The `vocab_size - 2` most frequent characters, most frequent first (ties: code point)."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [char for char, _ in ranked[:vocab_size - FIRST_TOKEN_ID]]


def token_ids(text: str, vocabulary: list[str]) -> list[int]:
    """The ids of `text`'s characters (OOV_ID for a character outside `vocabulary`)."""
    index = {char: i + FIRST_TOKEN_ID for i, char in enumerate(vocabulary)}
    return [index.get(char, OOV_ID) for char in text]


def detokenize(ids, vocabulary: list[str]) -> str:
    """The text of token `ids`: padding left out, out-of-vocabulary ids as U+FFFD."""
    chars = []
    for token in ids:
        token = int(token)
        if token >= FIRST_TOKEN_ID and token - FIRST_TOKEN_ID < len(vocabulary):
            chars.append(vocabulary[token - FIRST_TOKEN_ID])
        elif token == OOV_ID:
            chars.append("\ufffd")
    return "".join(chars)


class Pipeline(BasePipeline):
    """Character-level language-model windows from text; see the module docstring."""

    name = "text"
    default_splits = {"train": 0.8, "validation": 0.1, "test": 0.1}

    def __init__(self, **options):
        check_known(options, OPTIONS, self.name)
        super().__init__(**options)
        self.sequence_length = get_int(options, "sequence_length", 64, minimum=1)
        self.vocab_size = get_int(options, "vocab_size", 256, minimum=FIRST_TOKEN_ID + 1)
        self.block_windows = get_int(options, "block_windows", 16, minimum=1)

    # -- reading the source ---------------------------------------------------------------------

    def _documents(self, source: str):
        """Yields (name, source split, lines) per document; `lines` yields (number, text or
        BadRow), streaming."""
        if not source:
            yield EMBEDDED, None, enumerate(embedded_text().splitlines(keepends=True), start=1)
            return
        paths = list_files(source, EXTENSIONS, "text")
        for path, split in source_splits(paths).items():
            yield posixpath.basename(path), split, _file_lines(path)

    def prepare(self, source):
        counts, lines = Counter(), 0
        for _, _, numbered in self._documents(source):
            for _, line in numbered:
                if not isinstance(line, BadRow):
                    counts.update(line)
                    lines += 1
        if not counts:
            raise ConfigError(f"no text in {source or EMBEDDED!r}: pass .txt files (a file, a "
                              "directory or a glob) holding UTF-8 text.")
        vocabulary = build_vocabulary(counts, self.vocab_size)
        return {"tokenizer": TOKENIZER, "vocabulary": vocabulary,
                "vocab_size": len(vocabulary) + FIRST_TOKEN_ID,
                "sequence_length": self.sequence_length, "block_windows": self.block_windows,
                "pad_id": PAD_ID, "oov_id": OOV_ID, "num_characters": sum(counts.values()),
                "num_lines": lines, "source": source or EMBEDDED,
                # the label is the next tokens: task.type=auto trains a language model
                "label_stats": {"kind": "tokens", "shape": [self.sequence_length]}}

    def read(self, source, info, worker=0, num_workers=1):
        index = {char: i + FIRST_TOKEN_ID for i, char in enumerate(info["vocabulary"])}
        size = int(info["sequence_length"]) + 1
        blocks = int(info.get("block_windows", self.block_windows))
        count = 0  # rows (windows and bad lines) of all documents: the worker's share by index
        for name, split, numbered in self._documents(source):
            buffer, window = [], 0
            for number, line in numbered:
                if isinstance(line, BadRow):
                    if count % num_workers == worker:
                        yield Row(key=f"{name}:line {number}", value=line, split=split)
                    count += 1
                    continue
                buffer.extend(index.get(char, OOV_ID) for char in line)
                while len(buffer) >= size:
                    if count % num_workers == worker:
                        yield Row(key=f"{name}:{window:07d}", value=buffer[:size],
                                  split=split or self._block_split(name, window // blocks))
                    del buffer[:size]
                    window += 1
                    count += 1

    def _block_split(self, name: str, block: int) -> str:
        """The split of a block of consecutive windows: a hash of its place in the source."""
        return assign_split(f"{name}#block{block}", self.default_splits)

    # -- the records ----------------------------------------------------------------------------

    def features(self, info):
        return {"tokens": {"dtype": "int64", "shape": [int(info["sequence_length"]) + 1]}}

    def encode(self, row, info):
        ids = row.value
        if len(ids) != int(info["sequence_length"]) + 1:
            raise BadRow(f"a window of {len(ids)} tokens, not {info['sequence_length'] + 1}")
        return example_bytes.example({"tokens": example_bytes.int64_feature(ids)})

    def decode(self, features, info):
        import tensorflow as tf

        ids = tf.cast(features["tokens"], tf.int32)
        return ids[:, :-1], ids[:, 1:]


def _file_lines(path: str):
    """Yields (line number, text) of a file, or (number, BadRow) for a line not UTF-8."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield number, BadRow(f"line {number} is not UTF-8 text ({e.reason} at byte "
                                     f"{e.start})")

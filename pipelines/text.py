"""Language modeling on plain text: `.txt` files (one file, a glob or a directory), `.jsonl`
files whose rows are documents (`{"text": ...}`, `text_key`), or, with no `--input`, the
embedded default: Python's own documentation (`pydoc_data.topics`, part of every Python's
standard library; ~465k characters, no network).

Tokenizers (`tokenizer=`):
- `characters` (the default): `prepare` counts the characters of the training split and keeps
  the `vocab_size - 3` most frequent (ties broken by code point) as the vocabulary, stored in
  the manifest's `info`. Lossless and small (~100 ids): right for a CPU demo; a real corpus
  needs long sequences. It is the vocabulary `TextVectorization(split="character",
  standardize=None)` adapts to (the tests check it), counted in one streaming pass.
- `sentencepiece`: a SentencePiece unigram model of `vocab_size` ids (default 2048), trained on
  a seeded sample of at most `vocab_sample_mb` (16) MB of training text (`pipelines.subwords`),
  stored beside the shards as `tokenizer.model` (named and hashed in the manifest).
Ids: 0 is padding, 1 out of vocabulary, 2 the end of a document, the tokens follow. Datasets
converted before the end-of-document id (no `end_id` in `info`) have characters from id 2.
`info["token_bytes"]` holds the UTF-8 bytes each id stands for (bits per byte).

Splits come first, from the text: each document's lines are grouped into blocks of about
`block_windows * (sequence_length + 1)` characters, and each block goes to one split (its
source split: files named `train*`, `validation*`, `test*`; else a hash of its place, by
`default_splits` or `--splits`), so validation and test text comes in contiguous passages, the
vocabulary and the tokenizer are fitted on training text only, and the split does not depend
on the tokenizer. Packing: each split's blocks are tokenized and concatenated into one stream,
with the end-of-document id wherever the text does not continue (a document's end, or a jump
over passages of other splits), and cut into full, non-overlapping windows of
`sequence_length + 1` ids (the stored feature `tokens`; the last partial window of a split is
dropped, nothing is padded); a window never mixes splits. `decode` returns `(ids[:, :-1],
ids[:, 1:])`: the model reads the first `sequence_length` tokens and predicts each next one.

Options: tokenizer (characters), sequence_length (64), vocab_size (256 characters, 2048
sentencepiece, including the special ids), block_windows (16), vocab_sample_mb (16), text_key
(`text`, for .jsonl).
Bad rows: a line that is not valid UTF-8 (its key is `FILE:line N`; the line is left out of
the text); in .jsonl, a row that is not a JSON object with a string under `text_key`.
"""
from __future__ import annotations

import dataclasses
import json
import posixpath
from collections import Counter

from pipelines import subwords
from pipelines.base import BasePipeline, Row
from pipelines.options import check_known, get_int, get_str
from pipelines.sources import list_files, source_splits
from pipelines.text_sample import TextSample
from tftrain.data import example_bytes
from tftrain.data.manifest import TOKENIZER_MODEL
from tftrain.errors import BadRow, ConfigError

OPTIONS = ("tokenizer", "sequence_length", "vocab_size", "block_windows", "vocab_sample_mb",
           "text_key")
TOKENIZERS = ("characters", subwords.NAME)
EXTENSIONS = (".txt", ".jsonl")
EMBEDDED = "pydoc_data.topics"
PAD_ID, OOV_ID, END_ID, FIRST_TOKEN_ID = 0, 1, 2, 3
TOKENIZER = "characters"


def embedded_text() -> str:
    """The embedded default: every topic of Python's documentation, in topic-name order."""
    from pydoc_data import topics

    return "\n\n".join(topics.topics[name].strip("\n") for name in sorted(topics.topics)) + "\n"


def build_vocabulary(counts: Counter, vocab_size: int) -> list[str]:
    """The `vocab_size - 3` most frequent characters, most frequent first (ties: code point)."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [char for char, _ in ranked[:vocab_size - FIRST_TOKEN_ID]]


def character_bytes(counts: Counter, vocabulary: list[str], first_id: int) -> list[float]:
    """The UTF-8 bytes each id stands for (`info["token_bytes"]`, for bits per byte): 0 for
    the special ids, the mean over the characters left out of the vocabulary for the
    out-of-vocabulary id (1 when none is), each character's own bytes after them."""
    known = set(vocabulary)
    left_out = [(len(char.encode("utf-8")), count) for char, count in counts.items()
                if char not in known]
    unknown = sum(size * count for size, count in left_out) / max(1, sum(c for _, c in left_out))
    specials = [0.0] * first_id
    specials[OOV_ID] = unknown or 1.0
    return specials + [float(len(char.encode("utf-8"))) for char in vocabulary]


class Characters:
    """The character tokenizer of a dataset's `info` (its vocabulary and id layout)."""

    def __init__(self, info: dict):
        self.vocabulary = list(info["vocabulary"])
        self.end_id = info.get("end_id")  # None: a dataset converted before it existed
        self.first_id = FIRST_TOKEN_ID if self.end_id is not None else END_ID
        self.index = {char: i + self.first_id for i, char in enumerate(self.vocabulary)}

    def encode(self, text: str) -> list[int]:
        """The ids of `text`'s characters (OOV_ID for a character outside the vocabulary)."""
        return [self.index.get(char, OOV_ID) for char in text]

    def decode(self, ids) -> str:
        """The text of `ids`: special ids left out, out-of-vocabulary ids as U+FFFD."""
        chars = []
        for token in ids:
            token = int(token)
            if self.first_id <= token < self.first_id + len(self.vocabulary):
                chars.append(self.vocabulary[token - self.first_id])
            elif token == OOV_ID:
                chars.append("\ufffd")
        return "".join(chars)


def tokenizer_of(info: dict, assets: dict):
    """The tokenizer a dataset was converted with: `Characters`, or `subwords.Subwords` over
    its `tokenizer.model` (among `assets`, see `BasePipeline.load_assets`)."""
    if info.get("tokenizer") == subwords.NAME:
        return subwords.Subwords.of(assets)
    return Characters(info)


@dataclasses.dataclass(frozen=True)
class Block:
    """Consecutive lines of one document that go to one split."""

    document: str
    index: int  # its place in the document
    split: str
    text: str

    @property
    def key(self) -> str:
        return f"{self.document}#block{self.index}"


class Pipeline(BasePipeline):
    """Language-model windows of packed, tokenized text; see the module docstring."""

    name = "text"
    default_splits = {"train": 0.8, "validation": 0.1, "test": 0.1}

    def __init__(self, **options):
        check_known(options, OPTIONS, self.name)
        super().__init__(**options)
        self.tokenizer = get_str(options, "tokenizer", TOKENIZER)
        if self.tokenizer not in TOKENIZERS:
            raise ConfigError(f"tokenizer={self.tokenizer!r} is not one of "
                              f"{', '.join(TOKENIZERS)} (pipeline text)")
        subword = self.tokenizer == subwords.NAME
        self.sequence_length = get_int(options, "sequence_length", 64, minimum=1)
        self.vocab_size = get_int(options, "vocab_size", 2048 if subword else 256,
                                  minimum=subwords.MIN_VOCAB_SIZE if subword else FIRST_TOKEN_ID + 1)
        self.block_windows = get_int(options, "block_windows", 16, minimum=1)
        self.vocab_sample_mb = get_int(options, "vocab_sample_mb", 16, minimum=1)
        self.text_key = get_str(options, "text_key", "text")
        self._graph_tokenizer = None  # made by `graph_tokenizer` for the export

    # -- reading the source ---------------------------------------------------------------------

    def _documents(self, source: str):
        """Yields (name, source split, lines) per document; `lines` yields (number, text or
        BadRow), streaming. A .jsonl file's rows are documents of their own."""
        if not source:
            yield EMBEDDED, None, enumerate(embedded_text().splitlines(keepends=True), start=1)
            return
        paths = list_files(source, EXTENSIONS, "text")
        for path, split in source_splits(paths).items():
            name = posixpath.basename(path)
            if path.lower().endswith(".jsonl"):
                yield from _jsonl_documents(path, name, split, self.text_key)
            else:
                yield name, split, _file_lines(path)

    def _blocks(self, source: str, block_chars: int):
        """Yields the source's `Block`s in order, and a `Row` for each bad line."""
        for name, source_split, numbered in self._documents(source):
            lines, size, index = [], 0, 0
            for number, line in numbered:
                if isinstance(line, BadRow):
                    yield Row(key=f"{name}:line {number}", value=line, split=source_split)
                    continue
                lines.append(line)
                size += len(line)
                if size >= block_chars:
                    yield self._block(name, index, source_split, lines)
                    lines, size, index = [], 0, index + 1
            if lines:
                yield self._block(name, index, source_split, lines)

    def _block(self, name: str, index: int, source_split, lines: list[str]) -> Block:
        split = self.split_of(f"{name}#block{index}", source_split)
        return Block(name, index, split, "".join(lines))

    def _block_chars(self, info: dict | None = None) -> int:
        info = info or {}
        return (int(info.get("block_windows", self.block_windows))
                * (int(info.get("sequence_length", self.sequence_length)) + 1))

    def prepare(self, source):
        counts, sample, all_chars, lines = Counter(), TextSample(self.vocab_sample_mb << 20), 0, 0
        for block in self._blocks(source, self._block_chars()):
            if isinstance(block, Row):
                continue
            all_chars += len(block.text)
            lines += block.text.count("\n")
            if block.split == "train":
                if self.tokenizer == subwords.NAME:
                    sample.add(block.text)
                else:
                    counts.update(block.text)
        if not all_chars:
            raise ConfigError(f"no text in {source or EMBEDDED!r}: pass .txt files (a file, a "
                              "directory or a glob) holding UTF-8 text, or .jsonl documents.")
        if not (counts or sample.texts):
            raise ConfigError(f"no training text in {source or EMBEDDED!r}: every passage went to "
                              "another split; add train*.txt files or more text.")
        info = {"tokenizer": self.tokenizer, "sequence_length": self.sequence_length,
                "block_windows": self.block_windows, "pad_id": PAD_ID, "oov_id": OOV_ID,
                "end_id": END_ID, "num_characters": all_chars, "num_lines": lines,
                "source": source or EMBEDDED,
                # the label is the next tokens: task.type=auto trains a language model
                "label_stats": {"kind": "tokens", "shape": [self.sequence_length]}}
        return {**info, **self._fit_tokenizer(counts, sample)}

    def _fit_tokenizer(self, counts: Counter, sample: TextSample) -> dict:
        """The tokenizer's part of `info`, fitted on the training text (a subword model is kept
        in `assets`, written beside the shards)."""
        if self.tokenizer == subwords.NAME:
            model = subwords.train(sample.texts, self.vocab_size)
            self.assets = {TOKENIZER_MODEL: model}
            fitted = subwords.Subwords(model)
            return {"vocab_size": fitted.vocab_size, "tokenizer_model": TOKENIZER_MODEL,
                    "vocabulary_sample": sample.describe(), "token_bytes": fitted.token_bytes()}
        vocabulary = build_vocabulary(counts, self.vocab_size)
        return {"vocabulary": vocabulary, "vocab_size": len(vocabulary) + FIRST_TOKEN_ID,
                "token_bytes": character_bytes(counts, vocabulary, FIRST_TOKEN_ID)}

    def read(self, source, info, worker=0, num_workers=1):
        tokenizer = tokenizer_of(info, self.assets)
        size = int(info["sequence_length"]) + 1
        streams: dict[str, _Stream] = {}
        count = 0  # rows (windows and bad lines) so far: the worker's share by index
        for block in self._blocks(source, self._block_chars(info)):
            if isinstance(block, Row):
                if count % num_workers == worker:
                    yield block
                count += 1
                continue
            stream = streams.setdefault(block.split, _Stream())
            for window, split_key in stream.add(block, tokenizer.encode(block.text),
                                                info.get("end_id"), size):
                if count % num_workers == worker:
                    yield Row(key=f"{block.split}:{stream.windows - 1:09d}", value=window,
                              split=block.split, split_key=split_key)
                count += 1

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

    def text_inputs(self, texts, info):
        """The model's inputs for a batch of raw strings `texts` [batch] (the export's raw-text
        signature): each text's last `sequence_length` token ids, as `read` tokenizes it,
        left-aligned and padded with 0 after them, int32 [batch, sequence_length]."""
        length = int(info["sequence_length"])
        ids = self.graph_tokenizer(info).tokenize(texts)[:, -length:]
        return ids.to_tensor(default_value=PAD_ID, shape=[None, length])

    def graph_tokenizer(self, info):
        """The in-graph tokenizer (made once): tensorflow-text's `SentencepieceTokenizer` over the
        dataset's model, or a character lookup table; `tokenize(texts)` gives ragged int32 ids."""
        if self._graph_tokenizer is None:
            if info.get("tokenizer") == subwords.NAME:
                self._graph_tokenizer = subwords.graph_tokenizer(
                    subwords.Subwords.of(self.assets).model)
            else:
                self._graph_tokenizer = _CharacterLookup(Characters(info))
        return self._graph_tokenizer


class _CharacterLookup:
    """`Characters` in the graph: a text's characters looked up in a table of the vocabulary."""

    def __init__(self, characters: Characters):
        import tensorflow as tf

        self.table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant(characters.vocabulary or [""], tf.string),
            tf.constant(list(characters.index.values()) or [OOV_ID], tf.int32)),
            default_value=OOV_ID)

    def tokenize(self, texts):
        import tensorflow as tf

        return tf.ragged.map_flat_values(self.table.lookup, tf.strings.unicode_split(texts, "UTF-8"))


class _Stream:
    """One split's packed token stream: blocks' ids joined (the end-of-document id where the
    text does not continue), cut into windows as they fill."""

    def __init__(self):
        self.tokens: list[int] = []
        self.last = None  # (document, index) of the last block added
        self.windows = 0

    def add(self, block: Block, ids: list[int], end_id, size: int):
        """Adds a block; yields `(window, split key)` for each window it fills. The split key is
        the block's: every block of the stream has the split that key draws (see `read`)."""
        if end_id is not None and self.last is not None and \
                self.last != (block.document, block.index - 1):
            self.tokens.append(end_id)
        self.last = (block.document, block.index)
        self.tokens.extend(ids)
        cut = 0
        while len(self.tokens) - cut >= size:
            self.windows += 1
            yield self.tokens[cut:cut + size], block.key
            cut += size
        del self.tokens[:cut]


def _jsonl_documents(path: str, name: str, split, text_key: str):
    """Yields (name:line, split, lines) per row of a .jsonl file whose `text_key` is a string;
    (name, split, a BadRow) for a row that is not."""
    for number, line in _file_lines(path):
        if isinstance(line, BadRow):
            yield name, split, iter([(number, line)])
            continue
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            text = row[text_key]
            if not isinstance(text, str):
                raise TypeError(f"{text_key!r} holds a {type(text).__name__}, not a string")
        except (ValueError, KeyError, TypeError) as e:
            reason = f"line {number} is not a JSON object with a string under {text_key!r} ({e})"
            yield name, split, iter([(number, BadRow(reason))])
            continue
        yield f"{name}:{number}", split, enumerate(text.splitlines(keepends=True), start=1)


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

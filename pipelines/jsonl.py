"""Text classification from JSON Lines: one `{"text": "...", "label": ...}` object per line.

Tokenizing is `tf_keras.layers.TextVectorization`'s: `prepare` adapts one over the texts of the
training split (the rows the converter puts in `train`: by their source split, or by
`--splits` when it re-splits, so no validation or test word enters the vocabulary) and
stores its vocabulary and settings in the manifest's `info` (`tokenizer`, `standardize`,
`vocabulary`, `vocab_size`, `max_length`). `decode` builds the same layer from that
vocabulary, so training, evaluation and the export (`text_inputs`, the export's raw-string
signature) map a text to exactly the same ids: 0 = padding, 1 = out-of-vocabulary, words from
2, padded or truncated to `max_length`, returning `(int32 ids [batch, max_length], int32
label)`. The records keep the raw text (`text`) and the class id (`label`).

`tokenizer=sentencepiece`: subword tokens instead, a SentencePiece model of at most
`vocab_size` ids (default 8000) trained on the same sample of training texts
(`pipelines.subwords`), stored beside the shards as `tokenizer.model`; the records then hold
the ids (`tokens`, int64 [max_length], the first `max_length` ids padded with 0), so reading
costs no tokenization, and the export tokenizes raw text with tensorflow-text's
`SentencepieceTokenizer` over the same model, giving the same ids. Lossless: no lowercasing
(`lowercase=` is refused with it), no punctuation stripped, no word out of vocabulary.

Standardize: `lower_and_strip_punctuation` (or `strip_punctuation` with `lowercase=false`),
then a split on whitespace. Datasets converted before (their `info` has no `tokenizer`) keep
their own rule, ASCII punctuation replaced by a space, so their ids do not change.

Labels: integers are class ids (`num_classes` = max + 1); strings are class names, mapped to
ids in sorted order (`info["class_names"]`).

Options: text_key (default `text`), label_key (`label`), tokenizer (`TextVectorization` or
`sentencepiece`), vocab_size (10000, 8000 for sentencepiece, including the padding and
out-of-vocabulary ids), max_length (128), lowercase (true), vocab_sample_mb (16):
the vocabulary is adapted over at most this many MB of training text, a seeded reservoir
sample once the training texts are larger (`info["vocabulary_sample"]` says how many texts of
how many), so converting takes the same memory whatever the corpus's size.
Bad rows: invalid JSON, not an object, missing/empty/non-string text, missing label, a label
of the wrong type.

A source is one .jsonl file, a glob, or a directory of them; files named `train*.jsonl`,
`validation*.jsonl`, `test*.jsonl` keep those source splits. With no source (`--input` not
given), the embedded default: Unicode character names (Python's `unicodedata`, no network),
600 of each major general category, `{"text": "LATIN SMALL LETTER A", "label": "letter"}`,
5 classes: letter, mark, number, punctuation, symbol.
"""
from __future__ import annotations

import json
import posixpath

from pipelines.base import BasePipeline, Row
from pipelines.options import check_known, get_bool, get_int, get_str
from pipelines import class_ids, subwords
from pipelines.sources import list_files, predict_files, source_splits, text_lines, undecodable
from pipelines.text_sample import TextSample
from tftrain.data import example_bytes
from tftrain.data.manifest import TOKENIZER_MODEL
from tftrain.errors import BadRow, ConfigError

OPTIONS = ("text_key", "label_key", "vocab_size", "max_length", "lowercase", "vocab_sample_mb",
           "tokenizer")
EXTENSIONS = (".jsonl", ".ndjson")
PAD_ID, OOV_ID, FIRST_WORD_ID = 0, 1, 2
TOKENIZER = "TextVectorization"
TOKENIZERS = (TOKENIZER, subwords.NAME)
EMBEDDED = "unicodedata"
EMBEDDED_CLASSES = {"L": "letter", "M": "mark", "N": "number", "P": "punctuation",
                    "S": "symbol"}
EMBEDDED_PER_CLASS = 600
# The rule of datasets converted before TextVectorization: ASCII punctuation -> space.
LEGACY_PUNCTUATION = r"[!-/:-@\[-`{-~]"


def embedded_records() -> list[dict]:
    """The embedded default: `EMBEDDED_PER_CLASS` named characters of each major Unicode
    category, evenly spaced over the code points, as `{"text": name, "label": class}`."""
    import unicodedata

    found = {major: [] for major in EMBEDDED_CLASSES}
    for code in range(0x110000):
        name = unicodedata.name(chr(code), None)
        major = unicodedata.category(chr(code))[0]
        if name and major in found:
            found[major].append(name)
    records = []
    for major, names in found.items():
        step = len(names) / EMBEDDED_PER_CLASS
        records += [{"text": names[int(i * step)], "label": EMBEDDED_CLASSES[major]}
                    for i in range(min(EMBEDDED_PER_CLASS, len(names)))]
    return records


def _legacy_standardize(lowercase: bool):
    """The standardize callable of datasets converted before TextVectorization."""
    import tensorflow as tf

    def standardize(text):
        if lowercase:
            text = tf.strings.lower(text, encoding="utf-8")
        return tf.strings.regex_replace(text, LEGACY_PUNCTUATION, " ")

    return standardize


def vectorizer(info: dict, vocabulary: list[str] | None = None):
    """The `TextVectorization` layer of a dataset's `info` (or, with `vocabulary`, of that one).

    Built in the eager context (`tf.init_scope`), so a `tf.data` map function or a serving
    signature being traced can create it and capture its lookup table.
    """
    import tensorflow as tf
    import tf_keras as keras

    if info.get("tokenizer") == TOKENIZER:
        standardize = info["standardize"]
    else:
        standardize = _legacy_standardize(info.get("lowercase", True))
    words = info["vocabulary"] if vocabulary is None else vocabulary
    words = list(words) or [" "]  # an empty vocabulary: " " is never a word, all are OOV
    with tf.init_scope():
        return keras.layers.TextVectorization(
            standardize=standardize, split="whitespace", output_mode="int",
            output_sequence_length=int(info["max_length"]), vocabulary=words)


class _Vectorizers:
    """One layer per dataset vocabulary, built on first use and reused by every batch."""

    def __init__(self):
        self._layers = {}

    def get(self, info: dict):
        """The layer of `info`'s vocabulary."""
        key = (info.get("tokenizer"), info.get("standardize"), info.get("lowercase", True),
               int(info["max_length"]), tuple(info["vocabulary"]))
        if key not in self._layers:
            self._layers[key] = vectorizer(info)
        return self._layers[key]

    def __getstate__(self):  # layers do not cross process boundaries; workers rebuild them
        return {"_layers": {}}


class Pipeline(BasePipeline):
    """JSON Lines text classification; see the module docstring."""

    name = "jsonl"
    default_splits = {"train": 0.8, "validation": 0.1, "test": 0.1}

    def __init__(self, **options):
        check_known(options, OPTIONS, self.name)
        super().__init__(**options)
        self.text_key = get_str(options, "text_key", "text")
        self.label_key = get_str(options, "label_key", "label")
        self.tokenizer = get_str(options, "tokenizer", TOKENIZER)
        if self.tokenizer not in TOKENIZERS:
            raise ConfigError(f"tokenizer={self.tokenizer!r} is not one of "
                              f"{', '.join(TOKENIZERS)} (pipeline jsonl)")
        subword = self.tokenizer == subwords.NAME
        if subword and "lowercase" in options:
            raise ConfigError("lowercase= is an option of tokenizer=TextVectorization; "
                              "tokenizer=sentencepiece keeps the text as it is (pipeline jsonl)")
        self.vocab_size = get_int(options, "vocab_size", 8000 if subword else 10_000,
                                  minimum=subwords.MIN_VOCAB_SIZE if subword else 3)
        self.max_length = get_int(options, "max_length", 128, minimum=1)
        self.lowercase = get_bool(options, "lowercase", True)
        self.vocab_sample_mb = get_int(options, "vocab_sample_mb", 16, minimum=1)
        self._vectorizers = _Vectorizers()
        self._subword_model = None  # the SentencePiece model of `assets`, when encoding
        self._graph_tokenizer = None  # its in-graph twin, for the export

    def _lines(self, source: str):
        """Yields (key, line, source split) for every non-blank line, streaming."""
        if not source:
            for number, record in enumerate(embedded_records(), start=1):
                record = {self.text_key: record["text"], self.label_key: record["label"]}
                yield f"{EMBEDDED}:{number}", json.dumps(record), None
            return
        paths = list_files(source, EXTENSIONS, "JSON Lines")
        for path, split in source_splits(paths).items():
            for number, line in enumerate(text_lines(path), start=1):
                if line.strip():
                    yield f"{posixpath.basename(path)}:{number}", line, split

    def _parse(self, line: str) -> tuple[str, object]:
        """The (text, raw label) of one line; raises BadRow."""
        if undecodable(line):
            raise BadRow("bytes that are not UTF-8")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise BadRow(f"invalid JSON: {e}") from None
        except RecursionError:
            raise BadRow("invalid JSON: nested too deeply") from None
        if not isinstance(record, dict):
            raise BadRow(f"expected a JSON object, got {type(record).__name__}")
        if self.text_key not in record:
            raise BadRow(f"missing text key {self.text_key!r}")
        text = record[self.text_key]
        if not isinstance(text, str):
            raise BadRow(f"text {self.text_key!r} is a {type(text).__name__}, not a string")
        if not text.strip():
            raise BadRow(f"empty text in {self.text_key!r}")
        label = record.get(self.label_key)
        if label is None or label == "":
            raise BadRow(f"missing label {self.label_key!r}")
        if isinstance(label, bool) or not isinstance(label, (int, str)):
            raise BadRow(f"label {label!r} is neither an integer class id nor a class name")
        return text, label

    def prepare(self, source):
        texts, int_labels, str_labels = TextSample(self.vocab_sample_mb << 20), set(), set()
        largest = (-1, "")  # the largest integer label and the line it is on
        for key, line, split in self._lines(source):
            try:
                text, label = self._parse(line)
            except BadRow:
                continue  # the converter records it when it meets it in `read`
            if isinstance(label, int) and label < 0:
                continue  # not a class id: a bad row
            if self.split_of(key, split) == "train":
                texts.add(text)
            (str_labels if isinstance(label, str) else int_labels).add(label)
            if isinstance(label, int) and label > largest[0]:
                largest = (label, key)
        if not (str_labels or int_labels):
            raise ConfigError(f"no valid {{{self.text_key!r}: ..., {self.label_key!r}: ...}} lines "
                              f"in {source!r}; set text_key=/label_key= if the keys differ.")
        info = {**self._fit_tokenizer(texts), "vocabulary_sample": texts.describe(),
                "max_length": self.max_length, "source": source or EMBEDDED}
        if len(str_labels) >= len(int_labels) and str_labels:
            info["class_names"] = sorted(str_labels)
            info["num_classes"] = len(str_labels)
        else:
            info["num_classes"] = class_ids.num_classes(largest[0], len(int_labels),
                                                        f"line {largest[1]}")
        return info

    def _fit_tokenizer(self, texts: TextSample) -> dict:
        """The tokenizer's part of `info`, fitted on the sampled training texts: a SentencePiece
        model (kept in `assets`, written beside the shards) or a TextVectorization vocabulary."""
        if self.tokenizer == subwords.NAME:
            model = subwords.train(texts.texts, self.vocab_size)
            self.assets = {TOKENIZER_MODEL: model}
            return {"tokenizer": subwords.NAME, "tokenizer_model": TOKENIZER_MODEL,
                    "vocab_size": subwords.Subwords(model).vocab_size}
        standardize = "lower_and_strip_punctuation" if self.lowercase else "strip_punctuation"
        info = {"tokenizer": TOKENIZER, "standardize": standardize, "split": "whitespace",
                "max_length": self.max_length, "lowercase": self.lowercase}
        vocabulary = self._adapt(texts.texts, info)
        return {**info, "vocabulary": vocabulary, "vocab_size": len(vocabulary) + FIRST_WORD_ID}

    def _adapt(self, texts: list[str], info: dict) -> list[str]:
        """The words of a `TextVectorization` adapted over `texts` (padding and OOV left out)."""
        import tensorflow as tf

        if not texts:
            return []
        layer = _adapting_layer(info, self.vocab_size)
        layer.adapt(tf.data.Dataset.from_tensor_slices(texts).batch(1024))
        return [str(word) for word in layer.get_vocabulary()[FIRST_WORD_ID:]]

    def read(self, source, info, worker=0, num_workers=1):
        for index, (key, line, split) in enumerate(self._lines(source)):
            if index % num_workers == worker:
                yield Row(key=key, value=line, split=split)

    def features(self, info):
        if info.get("tokenizer") == subwords.NAME:  # the ids, tokenized at conversion
            return {"tokens": {"dtype": "int64", "shape": [int(info["max_length"])]},
                    "label": {"dtype": "int64", "shape": []}}
        return {"text": {"dtype": "string", "shape": []}, "label": {"dtype": "int64", "shape": []}}

    def encode(self, row, info):
        text, label = self._parse(row.value)
        names = info.get("class_names")
        if names is not None:
            if not isinstance(label, str) or label not in names:
                raise BadRow(f"label {label!r} is not one of the {len(names)} class names")
            label = names.index(label)
        elif not isinstance(label, int) or not 0 <= label < info["num_classes"]:
            raise BadRow(f"label {label!r} is not a class id in 0..{info['num_classes'] - 1}")
        if info.get("tokenizer") == subwords.NAME:
            length = int(info["max_length"])
            ids = self._subwords().encode(text)[:length]
            return example_bytes.example({
                "tokens": example_bytes.int64_feature(ids + [subwords.PAD_ID] * (length - len(ids))),
                "label": example_bytes.int64_feature(label)})
        return example_bytes.example({"text": example_bytes.bytes_feature(text),
                                      "label": example_bytes.int64_feature(label)})

    def predict_rows(self, source, info):
        """Rows of .jsonl files (objects with the text key; a label is not needed and other
        keys, such as an id, are passed through), or text lines of .txt files and of `-`
        (standard input), one text per line; blank lines are skipped, as conversion skips them."""
        stand_in = (info.get("class_names") or [0])[0]
        for path in predict_files(source, EXTENSIONS + (".txt",), "JSON Lines or text lines",
                                  self.name, stdin=True):
            json_lines = path.lower().endswith(EXTENSIONS)
            for number, line in enumerate(text_lines(path), start=1):
                if not line.strip():
                    continue
                key, value, passed = f"{path}:{number}", line, {}
                if not json_lines:
                    if not undecodable(line):
                        value = json.dumps({self.text_key: line.rstrip("\r\n"),
                                            self.label_key: stand_in})
                else:
                    try:
                        record = json.loads(line)
                    except (ValueError, RecursionError):
                        record = None  # `encode` says why
                    if isinstance(record, dict) and not undecodable(line):
                        passed = {k: v for k, v in record.items()
                                  if k not in (self.text_key, self.label_key)}
                        value = json.dumps({**record, self.label_key: stand_in})
                yield Row(key=key, value=value), passed

    def _subwords(self) -> subwords.Subwords:
        if self._subword_model is None:
            self._subword_model = subwords.Subwords.of(self.assets)
        return self._subword_model

    def text_inputs(self, texts, info):
        """The model's inputs for a batch of raw strings `texts` [batch]: int32 token ids
        [batch, max_length], exactly as `decode` gives them (the export's raw-text signature)."""
        import tensorflow as tf

        if info.get("tokenizer") == subwords.NAME:
            if self._graph_tokenizer is None:
                self._graph_tokenizer = subwords.graph_tokenizer(self._subwords().model)
            ids = self._graph_tokenizer.tokenize(texts)
            return ids.to_tensor(default_value=subwords.PAD_ID, shape=[None, int(info["max_length"])])
        return tf.cast(self._vectorizers.get(info)(texts), tf.int32)

    def decode(self, features, info):
        import tensorflow as tf

        label = tf.cast(features["label"], tf.int32)
        if info.get("tokenizer") == subwords.NAME:
            return tf.cast(features["tokens"], tf.int32), label
        return self.text_inputs(features["text"], info), label


def _adapting_layer(info: dict, vocab_size: int):
    """A fresh `TextVectorization` with `info`'s settings, to adapt (`vocab_size` ids in all)."""
    import tf_keras as keras

    return keras.layers.TextVectorization(
        max_tokens=vocab_size, standardize=info["standardize"], split="whitespace",
        output_mode="int", output_sequence_length=int(info["max_length"]))

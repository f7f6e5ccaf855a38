"""Text classification from JSON Lines: one `{"text": "...", "label": ...}` object per line.

`prepare` reads the source once, counts words and keeps the `vocab_size - 2` most frequent ones
(ties broken alphabetically) as the vocabulary, stored in the manifest's `info` with the
tokenizer settings, so the dataset carries everything its training side needs. The records keep
the raw text (`text`) and the class id (`label`).

Tokenizing (the same in Python at conversion time and in TensorFlow ops at training time):
lowercase (unless `lowercase=false`), ASCII punctuation -> space, split on ASCII whitespace.
`decode` maps each word to its id with a `tf.lookup.StaticHashTable` (0 = padding,
1 = out-of-vocabulary, words from 2) and pads or truncates to `max_length`, returning
`(int32 ids [batch, max_length], int32 label)`: ready for `Embedding` -> pooling -> `Dense`.

Labels: integers are class ids (`num_classes` = max + 1); strings are class names, mapped to
ids in sorted order (`info["class_names"]`).

Options: text_key (default `text`), label_key (`label`), vocab_size (10000, including the
padding and out-of-vocabulary ids), max_length (128), lowercase (true).
Bad rows: invalid JSON, not an object, missing/empty/non-string text, missing label, a label
of the wrong type.

A source is one .jsonl file, a glob, or a directory of them; files named `train*.jsonl`,
`validation*.jsonl`, `test*.jsonl` keep those source splits.
"""
from __future__ import annotations

import json
import posixpath
import re
from collections import Counter

from pipelines.base import BasePipeline, Row
from pipelines.lookup import TableCache
from pipelines.options import check_known, get_bool, get_int, get_str
from pipelines.sources import list_files, source_splits
from tftrain.data import example_bytes
from tftrain.errors import BadRow, ConfigError

OPTIONS = ("text_key", "label_key", "vocab_size", "max_length", "lowercase")
EXTENSIONS = (".jsonl", ".ndjson")
PAD_ID, OOV_ID, FIRST_WORD_ID = 0, 1, 2
# ASCII punctuation; the same pattern in Python's `re` and TensorFlow's RE2.
PUNCTUATION = r"[!-/:-@\[-`{-~]"
_WHITESPACE = re.compile(r"[ \t\n\v\f\r]+")


def tokenize(text: str, lowercase: bool = True) -> list[str]:
    """The words of `text`, exactly as `decode` splits them in TensorFlow."""
    if lowercase:
        text = text.lower()
    return [w for w in _WHITESPACE.split(re.sub(PUNCTUATION, " ", text)) if w]


class Pipeline(BasePipeline):
    """JSON Lines text classification; see the module docstring."""

    name = "jsonl"
    default_splits = {"train": 0.8, "validation": 0.1, "test": 0.1}

    def __init__(self, **options):
        check_known(options, OPTIONS, self.name)
        super().__init__(**options)
        self.text_key = get_str(options, "text_key", "text")
        self.label_key = get_str(options, "label_key", "label")
        self.vocab_size = get_int(options, "vocab_size", 10_000, minimum=3)
        self.max_length = get_int(options, "max_length", 128, minimum=1)
        self.lowercase = get_bool(options, "lowercase", True)
        self._tables = TableCache()

    def _lines(self, source: str):
        """Yields (key, line, source split) for every non-blank line, streaming."""
        import tensorflow as tf

        paths = list_files(source, EXTENSIONS, "JSON Lines")
        for path, split in source_splits(paths).items():
            with tf.io.gfile.GFile(path, "r") as f:
                for number, line in enumerate(f, start=1):
                    if line.strip():
                        yield f"{posixpath.basename(path)}:{number}", line, split

    def _parse(self, line: str) -> tuple[str, object]:
        """The (text, raw label) of one line; raises BadRow."""
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise BadRow(f"invalid JSON: {e}") from None
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
        words, int_labels, str_labels, rows = Counter(), set(), set(), 0
        for _, line, _ in self._lines(source):
            try:
                text, label = self._parse(line)
            except BadRow:
                continue  # the converter records it when it meets it in `read`
            if isinstance(label, int) and label < 0:
                continue  # not a class id: a bad row
            rows += 1
            words.update(tokenize(text, self.lowercase))
            (str_labels if isinstance(label, str) else int_labels).add(label)
        if not rows:
            raise ConfigError(f"no valid {{{self.text_key!r}: ..., {self.label_key!r}: ...}} lines "
                              f"in {source!r}; set text_key=/label_key= if the keys differ.")
        vocabulary = [w for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))]
        vocabulary = vocabulary[:self.vocab_size - FIRST_WORD_ID]
        info = {"vocabulary": vocabulary, "vocab_size": len(vocabulary) + FIRST_WORD_ID,
                "max_length": self.max_length, "lowercase": self.lowercase}
        if len(str_labels) >= len(int_labels) and str_labels:
            info["class_names"] = sorted(str_labels)
            info["num_classes"] = len(str_labels)
        else:
            info["num_classes"] = max(int_labels) + 1
        return info

    def read(self, source, info, worker=0, num_workers=1):
        for index, (key, line, split) in enumerate(self._lines(source)):
            if index % num_workers == worker:
                yield Row(key=key, value=line, split=split)

    def features(self, info):
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
        return example_bytes.example({"text": example_bytes.bytes_feature(text),
                                      "label": example_bytes.int64_feature(label)})

    def decode(self, features, info):
        import tensorflow as tf

        text = features["text"]
        if info.get("lowercase", True):
            text = tf.strings.lower(text, encoding="utf-8")
        words = tf.strings.split(tf.strings.regex_replace(text, PUNCTUATION, " "))
        table = self._tables.get("vocabulary", info["vocabulary"], FIRST_WORD_ID, OOV_ID)
        ids = tf.ragged.map_flat_values(table.lookup, words)
        ids = ids.to_tensor(default_value=PAD_ID, shape=[None, info["max_length"]])
        return tf.cast(ids, tf.int32), tf.cast(features["label"], tf.int32)

"""CSV files with a header row: typed feature columns and a label column.

Column types:
    float, int    numbers (stored as float32 / int64); standardized at decode time with the mean
                  and standard deviation measured by `prepare`.
    categorical   a few distinct strings; the vocabulary (most frequent first, at most
                  `max_categories`) is built by `prepare` and stored in the manifest's `info`;
                  values outside it share one extra "unknown" slot.
    string        free text, stored as is (kept in the records, left out of the default decode).
    ignore        not stored (e.g. an id column).
Types are inferred from the data (a column whose values are >= 90% numbers is `float`, else
`categorical` when it has at most `max_categories` distinct values and at most one per two
rows, else `string`) or declared
with `columns="age:float,city:categorical,notes:string"`. The label column is `int` (class ids
as written), `categorical` (class names -> ids in sorted order) or `float` (regression); its
statistics (distinct values, range, mean, standard deviation) go to the manifest's
`info["label_stats"]`, from which `task.type=auto` decides between classification and
regression (whole numbers with many distinct values are a quantity: see `tftrain.tasks`).

Bad rows (skipped and recorded by the converter): a missing or extra field, a value of the
wrong type, an empty or NaN number unless `allow_nan=true` (then it is imputed with the column
mean at decode time), an empty or unknown label.

`decode` returns `(x, label)` where `x` is one float32 matrix [batch, info["input_dim"]]:
standardized numbers followed by one-hot categories, which a plain `Dense` model trains on
directly. With `output=dict`, `x` is instead a dict of per-column tensors (standardized float32
numbers, int64 category ids, raw strings) for models with their own preprocessing.

Options: label_column (default `label`), columns, delimiter (default `,`, tab for `.tsv`;
`tab` names a tab), allow_nan (false), max_categories (100), output (`matrix` or `dict`).

A source is one CSV file, a glob, or a directory of them; all must share the header. Files named
`train*.csv`, `validation*.csv`, `test*.csv` keep those source splits.
"""
from __future__ import annotations

import csv
import dataclasses
import math
import posixpath
from collections import Counter

from pipelines.base import BasePipeline, Row
from pipelines.lookup import TableCache
from pipelines.options import check_known, get_bool, get_int, get_str
from pipelines import class_ids
from pipelines.sources import list_files, predict_files, source_splits, text_lines, undecodable
from tftrain.data import example_bytes
from tftrain.errors import BadRow, ConfigError, DataError

OPTIONS = ("label_column", "columns", "delimiter", "allow_nan", "max_categories", "output")
EXTENSIONS = (".csv", ".tsv", ".txt")
TYPES = ("float", "int", "categorical", "string", "ignore")
LABEL_TYPES = ("int", "categorical", "float")
NUMERIC_SHARE = 0.9  # a column is numeric when at least this share of its values are numbers
_MISSING = {"", "nan", "NaN", "NAN", "NA", "N/A", "null", "None"}


@dataclasses.dataclass(frozen=True)
class BadLine:
    """A CSV row that could not be read into fields, and why (a bad row)."""

    reason: str


def _parse_declared(text: str | None) -> dict[str, str]:
    declared = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        name, sep, kind = part.rpartition(":")
        if not sep or not name or kind not in TYPES:
            raise ConfigError(f"bad column declaration {part!r} in columns={text!r}: write "
                              f"name:type with type one of {', '.join(TYPES)}.")
        declared[name] = kind
    return declared


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class _ColumnStats:
    """One streaming pass over a column: numeric share, mean/std (Welford), value counts."""

    def __init__(self, max_categories: int):
        self.limit = max_categories
        self.values = self.numbers = self.ints = 0
        self.max_int = -1  # the largest non-negative integer value
        self.min = self.max = None  # of the numbers
        self.mean = self.m2 = 0.0
        self.counts: Counter | None = Counter()

    def add(self, text: str) -> None:
        if text.strip() in _MISSING:
            return
        self.values += 1
        number = _number(text)
        if number is not None and math.isfinite(number):
            self.numbers += 1
            if number.is_integer() and number >= 0:
                self.ints += 1
                self.max_int = max(self.max_int, int(number))
            self.min = number if self.min is None else min(self.min, number)
            self.max = number if self.max is None else max(self.max, number)
            delta = number - self.mean
            self.mean += delta / self.numbers
            self.m2 += delta * (number - self.mean)
        if self.counts is not None:
            self.counts[text] += 1
            if len(self.counts) > max(self.limit, 1000):  # free text: stop counting
                self.counts = None

    @property
    def std(self) -> float:
        std = math.sqrt(self.m2 / self.numbers) if self.numbers else 0.0
        return std if std > 1e-12 else 1.0

    def infer(self) -> str:
        if self.values and self.numbers >= NUMERIC_SHARE * self.values:
            return "float"
        distinct = len(self.counts) if self.counts is not None else math.inf
        if distinct <= self.limit and distinct <= max(2, self.values // 2):  # values repeat
            return "categorical"
        return "string"

    def label_stats(self, kind: str) -> dict:
        """What the task needs to know about a label column of type `kind` (see
        `tftrain.tasks.registry`): its distinct values (None: more than were counted) and, for a
        number, its range, mean and standard deviation (the regression head's scale)."""
        stats = {"kind": kind, "shape": [],
                 "distinct": len(self.counts) if self.counts is not None else None}
        if kind != "categorical":
            stats.update(count=self.numbers, min=self.min, max=self.max, mean=self.mean,
                         std=self.std)
        return stats

    def vocabulary(self) -> list[str]:
        counts = self.counts or Counter()
        return [v for v, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))][:self.limit]


class Pipeline(BasePipeline):
    """CSV rows -> typed features and a label; see the module docstring."""

    name = "csv"
    default_splits = {"train": 0.8, "validation": 0.1, "test": 0.1}

    def __init__(self, **options):
        check_known(options, OPTIONS, self.name)
        super().__init__(**options)
        self.label_column = get_str(options, "label_column", "label")
        self.declared = _parse_declared(get_str(options, "columns"))
        delimiter = get_str(options, "delimiter")
        self.delimiter = "\t" if delimiter in ("tab", "\\t") else delimiter  # None: by extension
        self.allow_nan = get_bool(options, "allow_nan")
        self.max_categories = get_int(options, "max_categories", 100, minimum=1)
        self.output = get_str(options, "output", "matrix")
        if self.output not in ("matrix", "dict"):
            raise ConfigError(f"pipeline option output={self.output!r} must be matrix or dict.")
        if self.declared.get(self.label_column, "int") not in LABEL_TYPES:
            raise ConfigError(f"the label column {self.label_column!r} must be one of "
                              f"{', '.join(LABEL_TYPES)}, not {self.declared[self.label_column]!r}.")
        self._tables = TableCache()

    # -- reading -------------------------------------------------------------------------------

    def _rows(self, path: str):
        """Yields (line number, header, fields) of one CSV file, streaming; fields are a
        `BadLine` for a row the csv module cannot read (bytes that are not UTF-8, a field over
        its size limit, a stray quote). A quote that never closes is an error: it would take
        the rest of the file as one field."""
        delimiter = self.delimiter or ("\t" if path.lower().endswith(".tsv") else ",")
        reader = csv.reader(text_lines(path), delimiter=delimiter, strict=True)
        _, header = self._next_row(reader, path)
        if not header or isinstance(header, BadLine):
            raise ConfigError(f"CSV file {path} has no readable header row"
                              + (f" ({header.reason})." if header else "."))
        header[0] = header[0].lstrip("\ufeff")
        yield 1, header, None
        while True:
            start, fields = self._next_row(reader, path)
            if fields is None:
                return
            if fields:
                yield start, header, fields

    @staticmethod
    def _next_row(reader, path: str):
        """The line where the next row of `reader` starts, and the row: its fields, a BadLine,
        or None at the end."""
        start = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            return start, None
        except csv.Error as e:
            if "unexpected end of data" in str(e):
                raise DataError(
                    f"CSV file {path}: the quote that opens a field on line {start} never "
                    f"closes, so the rest of the file (lines {start}-{reader.line_num}) would be "
                    "one field; fix the quoting (a quote inside a field is written twice: \"\")."
                ) from None
            return start, BadLine(f"line {start}: {e}")
        if any(undecodable(field) for field in fields):
            return start, BadLine(f"line {start}: bytes that are not UTF-8")
        return start, fields

    def prepare(self, source):
        paths = list_files(source, EXTENSIONS, "CSV")
        header, stats, rows = None, None, 0
        for path in paths:
            for line, file_header, fields in self._rows(path):
                if fields is None:
                    if header is None:
                        header = self._check_header(file_header, path)
                        stats = {name: _ColumnStats(self.max_categories) for name in header}
                    elif file_header != header:
                        raise ConfigError(f"CSV file {path} has header {file_header}, but "
                                          f"{paths[0]} has {header}: all files must share one header.")
                    continue
                rows += 1
                if isinstance(fields, BadLine):
                    continue  # the converter records it when it meets it in `read`
                for name, text in zip(header, fields):
                    stats[name].add(text)
        if not rows:
            raise ConfigError(f"no data rows found in {source!r} (only a header).")
        return self._info(header, stats, paths)

    def _check_header(self, header: list[str], path: str) -> list[str]:
        if len(set(header)) != len(header) or not all(header):
            raise ConfigError(f"CSV header of {path} has empty or repeated column names: {header}.")
        if self.label_column not in header:
            raise ConfigError(f"label column {self.label_column!r} is not in the header of {path} "
                              f"({', '.join(header)}); pass --pipeline_options=label_column=NAME.")
        unknown = sorted(set(self.declared) - set(header))
        if unknown:
            raise ConfigError(f"declared column(s) {', '.join(unknown)} are not in the header of "
                              f"{path} ({', '.join(header)}).")
        return header

    def _info(self, header, stats, paths) -> dict:
        columns = []
        input_dim = 0
        for name in header:
            if name == self.label_column:
                continue
            kind = self.declared.get(name) or stats[name].infer()
            column = {"name": name, "type": kind}
            if kind in ("float", "int"):
                column.update(mean=stats[name].mean, std=stats[name].std)
                input_dim += 1
            elif kind == "categorical":
                column["vocabulary"] = stats[name].vocabulary()
                input_dim += len(column["vocabulary"]) + 1  # + the unknown slot
            columns.append(column)
        label_stats = stats[self.label_column]
        label_type = self.declared.get(self.label_column)
        if label_type is None:
            kind = label_stats.infer()
            label_type = ("int" if label_stats.ints >= NUMERIC_SHARE * label_stats.values else "float") \
                if kind == "float" else "categorical"
        label = {"name": self.label_column, "type": label_type}
        info = {"header": header, "columns": columns, "label": label, "input_dim": input_dim,
                "label_stats": label_stats.label_stats(label_type)}
        if label_type == "categorical":
            label["class_names"] = sorted(label_stats.counts or ())
            if not label["class_names"] or label_stats.counts is None:
                raise ConfigError(f"label column {self.label_column!r} has no values or too many "
                                  "distinct ones for class names; declare its type with columns=.")
            info.update(class_names=label["class_names"], num_classes=len(label["class_names"]))
        elif label_type == "int":
            info["num_classes"] = class_ids.num_classes(
                label_stats.max_int, len(label_stats.counts or ()) or label_stats.ints,
                f"column {self.label_column!r}")
        return info

    def read(self, source, info, worker=0, num_workers=1):
        paths = list_files(source, EXTENSIONS, "CSV")
        splits = source_splits(paths)
        index = 0
        for path in paths:
            for line, _, fields in self._rows(path):
                if fields is None:
                    continue
                if index % num_workers == worker:
                    yield Row(key=f"{posixpath.basename(path)}:{line}", value=fields, split=splits[path])
                index += 1

    # -- encoding ------------------------------------------------------------------------------

    def features(self, info):
        dtypes = {"float": "float32", "int": "int64", "categorical": "string", "string": "string"}
        schema = {c["name"]: {"dtype": dtypes[c["type"]], "shape": []}
                  for c in info["columns"] if c["type"] != "ignore"}
        label_dtype = "float32" if info["label"]["type"] == "float" else "int64"
        schema[info["label"]["name"]] = {"dtype": label_dtype, "shape": []}
        return schema

    def encode(self, row, info):
        header, fields = info["header"], row.value
        if isinstance(fields, BadLine):
            raise BadRow(fields.reason)
        if len(fields) != len(header):
            raise BadRow(_field_count_problem(fields, header))
        values = dict(zip(header, fields))
        feature = {}
        for column in info["columns"]:
            name, kind = column["name"], column["type"]
            if kind == "ignore":
                continue
            text = values[name]
            if kind in ("float", "int"):
                number = self._number(name, text, kind)
                feature[name] = (example_bytes.float_feature(number) if kind == "float" else
                                 example_bytes.int64_feature(int(number)))
            else:
                feature[name] = example_bytes.bytes_feature(text)
        feature[info["label"]["name"]] = self._label(values[info["label"]["name"]], info)
        return example_bytes.example(feature)

    def predict_rows(self, source, info):
        """The rows of CSV files (or `-`, standard input) with a header: their columns are
        matched to the dataset's by name, in any order; the label column may be absent (its
        stand-in is the first class, or 0), and every column the model does not read (an id,
        the label, ignored ones) is passed through. A file without a column the model reads is
        a ConfigError."""
        header, label = info["header"], info["label"]["name"]
        read = [c["name"] for c in info["columns"] if c["type"] != "ignore"]
        stand_in = (info["label"].get("class_names") or ["0"])[0]
        for path in predict_files(source, EXTENSIONS, "CSV files", self.name, stdin=True):
            passed = []
            for line, file_header, fields in self._rows(path):
                if fields is None:
                    missing = [name for name in read if name not in file_header]
                    if missing:
                        raise ConfigError(
                            f"CSV file {path} has no column {', '.join(missing)}, which the "
                            f"model reads (its dataset's header: {', '.join(header)}); add "
                            "the column, or check --pipeline_options=delimiter=")
                    passed = [name for name in file_header if name not in read]
                    continue
                key = f"{path}:{line}"
                if isinstance(fields, BadLine):
                    yield Row(key=key, value=fields), {}
                    continue
                values = dict(zip(file_header, fields))
                if len(fields) != len(file_header):  # what it has is passed through (its id)
                    yield (Row(key=key, value=BadLine(_field_count_problem(fields, file_header))),
                           {name: values[name] for name in passed if name in values})
                    continue
                value = [stand_in if name == label else values.get(name, "") for name in header]
                yield Row(key=key, value=value), {name: values[name] for name in passed}

    def _number(self, name: str, text: str, kind: str) -> float:
        if text.strip() in _MISSING:
            if self.allow_nan and kind == "float":
                return math.nan
            raise BadRow(f"column {name!r}: missing value {text!r} (pass allow_nan=true to impute "
                         "float columns)")
        number = _number(text)
        if number is None:
            raise BadRow(f"column {name!r}: {text!r} is not a number")
        if not math.isfinite(number):
            raise BadRow(f"column {name!r}: {text!r} is not a finite number")
        if kind == "int" and not number.is_integer():
            raise BadRow(f"column {name!r}: {text!r} is not an integer")
        return number

    def _label(self, text: str, info: dict):
        label = info["label"]
        if not text.strip():
            raise BadRow(f"empty label in column {label['name']!r}")
        if label["type"] == "float":
            value = _number(text)
            if value is None or not math.isfinite(value):
                raise BadRow(f"label {text!r} in column {label['name']!r} is not a finite number")
            return example_bytes.float_feature(value)
        if label["type"] == "categorical":
            if text not in label["class_names"]:
                raise BadRow(f"label {text!r} is not one of the {len(label['class_names'])} classes")
            value = label["class_names"].index(text)
        else:
            if not _is_class_id(text) or int(float(text)) >= info["num_classes"]:
                raise BadRow(f"label {text!r} in column {label['name']!r} is not a class id in "
                             f"0..{info['num_classes'] - 1}")
            value = int(float(text))
        return example_bytes.int64_feature(value)

    # -- decoding ------------------------------------------------------------------------------

    def decode(self, features, info):
        import tensorflow as tf

        inputs = {}
        for column in info["columns"]:
            name, kind = column["name"], column["type"]
            if kind in ("float", "int"):
                x = (tf.cast(features[name], tf.float32) - column["mean"]) / column["std"]
                inputs[name] = tf.where(tf.math.is_nan(x), tf.zeros_like(x), x)  # NaN -> the mean
            elif kind == "categorical":
                vocabulary = column["vocabulary"]
                table = self._tables.get(name, vocabulary, 0, len(vocabulary))
                inputs[name] = table.lookup(features[name])
            elif kind == "string":
                inputs[name] = features[name]
        label_column = info["label"]
        label = features[label_column["name"]]
        label = tf.cast(label, tf.float32 if label_column["type"] == "float" else tf.int32)
        if self.output == "dict":
            return inputs, label
        parts = []
        for column in info["columns"]:
            if column["type"] in ("float", "int"):
                parts.append(inputs[column["name"]][:, None])
            elif column["type"] == "categorical":
                parts.append(tf.one_hot(inputs[column["name"]], len(column["vocabulary"]) + 1))
        if not parts:
            raise ConfigError("the CSV dataset has no numeric or categorical columns to build a "
                              "matrix from; decode with --pipeline_options=output=dict.")
        return tf.concat(parts, axis=1), label


def _field_count_problem(fields: list[str], header: list[str]) -> str:
    """Why a row of `fields` does not fit `header` (a BadRow's reason)."""
    missing = header[len(fields):]
    if missing:
        return (f"missing column(s) {', '.join(missing)}: the row has {len(fields)} fields, the "
                f"header {len(header)}")
    return f"the row has {len(fields)} fields, more than the {len(header)} in the header"


def _is_class_id(text: str) -> bool:
    number = _number(text)
    return number is not None and math.isfinite(number) and number.is_integer() and number >= 0

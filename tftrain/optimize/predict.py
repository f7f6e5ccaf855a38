"""`tftrain predict`: a trained model's answers for new raw files, preprocessed exactly as its
training data was.

Each raw row goes through the dataset's own pipeline: `predict_rows` reads it as the converter
reads a row (with a stand-in label), `encode` makes the serialized `tf.train.Example` the
converter would have written (with the manifest's statistics, vocabulary and classes), and the
model takes it as its training data reached it: a SavedModel through its `serving_examples`
signature, which parses and decodes with the pipeline's `decode`; a .tflite through the
reader's parse and decode (`reader.batch_decoder`), then the LiteRT interpreter. No decode
exists twice. `--data=DIR --split=NAME` feeds a converted split's records instead.

Rows stream in batches of `batch_size`, the next batch encoded in a thread while the model runs
the current one: memory does not grow with the input. The output (CSV or JSON Lines, one row per
input row, in input order) is written under a temporary name and renamed once complete
(`fileio.atomic_file`). Nothing is dropped: a row that cannot be read, encoded or decoded gets
its output row with the reason in `error`; a batch the model refuses runs again one row at a
time to find which.
"""
from __future__ import annotations

import collections
import concurrent.futures
import csv
import threading
import dataclasses
import io
import itertools
import json
import os
import posixpath
import time

import numpy as np
import tensorflow as tf

from pipelines import dataset_pipeline
from tftrain.data import foreign, reader
from tftrain.data import manifest as manifest_lib
from tftrain.data.progress import Progress
from tftrain.engine import export, run_config
from tftrain.errors import BadRow, ConfigError, DataError, TftrainError, first_line
from tftrain.fileio import atomic_file
from tftrain.optimize import evaluate, runs, tflite_eval

FORMATS = (".csv", ".jsonl")
DEFAULT_BATCH_SIZE = 256
IN_FLIGHT = 2  # batches run at once (bench/predict.py)


@dataclasses.dataclass(frozen=True)
class Item:
    """One input row on its way to the output: where it came from (`key`: a path, `file:line`
    or a record's index), the fields passed through, its serialized Example (None when it could
    not be made) and why not (`error`, empty for a good row)."""

    key: str
    passed: dict
    example: bytes | None
    error: str = ""


@dataclasses.dataclass(frozen=True)
class Summary:
    """What one prediction did: rows written, how many bad, where, how fast (`seconds` from
    the first row to the last, after loading the model; `cpu_seconds`: the process's CPU time,
    user and system, over the same span, which other work on the machine does not inflate)."""

    rows: int
    bad: int
    output: str
    seconds: float
    first_bad: str = ""
    cpu_seconds: float = 0.0

    def line(self) -> str:
        """The summary line `tftrain predict` prints."""
        rate = self.rows / max(self.seconds, 1e-9)
        bad = (f"{self.bad:,} bad (their error column says why; first: {self.first_bad})"
               if self.bad else "none bad")
        return (f"predicted {self.rows:,} rows into {self.output}: {bad}; {self.seconds:.1f}s, "
                f"{rate:,.0f} rows/s")


def predict(model: str, output: str, *, input_path: str | None = None,
            data: str | None = None, split: str | None = None, top_k: int = 1,
            batch_size: int = DEFAULT_BATCH_SIZE, overwrite: bool = False,
            max_bad_fraction: float = 0.01, pipeline_options: dict | None = None,
            num_threads: int | None = None) -> Summary:
    """Writes `model`'s answer for every row of `input_path` (raw files) or of `data`'s `split`
    (converted records) to `output` (see the module docstring and `Columns`); returns the
    summary. `model`: a run directory (its export), a SavedModel directory or a .tflite file of
    a run. `split` None: `test`, as `tftrain evaluate --data` takes it. `pipeline_options`: the conversion's reading options (a CSV delimiter, a JSON text
    key) when they were not the defaults. `num_threads`: the interpreter's (default: this
    machine's cores). Raises ConfigError for bad flags before any work, DataError when more
    than `max_bad_fraction` of the rows were bad (the output is written first)."""
    check_output(output, overwrite)
    if (input_path is None) == (data is None):
        raise ConfigError("give the rows to predict with one of --input=PATH (raw files, or - "
                          "for standard input) and --data=DIR --split=NAME (converted records)")
    if batch_size < 1:
        raise ConfigError(f"--batch_size={batch_size} must be >= 1")
    path, run = find_model(model)
    task, manifest, pipeline = read_run(run, pipeline_options)
    if task.name == "language_model":
        raise ConfigError(f"{model} is a language model, which continues text rather than "
                          f"labelling rows: use tftrain generate --model_dir={run} "
                          "--prompt=TEXT")
    info = manifest.get("info", {})
    columns = Columns.of(task, info, top_k)
    if input_path is not None:
        items = raw_items(pipeline, input_path, info)
    else:
        split = split or evaluate.DEFAULT_SPLIT
        items = record_items(data, split, manifest)
    runner = (TfliteRunner(path, manifest, pipeline, info, batch_size, num_threads,
                           classifier=bool(columns.class_names))
              if path.endswith(".tflite") else SavedModelRunner(path))
    started, cpu = time.monotonic(), time.process_time()
    rows = bad = 0
    first_bad = ""
    progress = Progress(None, label="predict")
    with atomic_file(output) as f:
        writer = Writer(f, output, columns)
        for answered in answered_in_order(runner, prefetched(batched(items, batch_size))):
            writer.write(answered)
            f.flush()  # what a reader of the temporary file sees keeps up with the rows
            errors = [item for item, _ in answered if item.error]
            if errors and not first_bad:
                first_bad = f"{errors[0].key}: {errors[0].error}"
            rows += len(answered)
            bad += len(errors)
            progress.update(examples=len(answered) - len(errors), bad=len(errors))
        progress.close()
        if not rows:
            given = f"--input={input_path}" if input_path is not None else f"--data={data}"
            raise DataError(f"{given} holds no rows to predict (split {split!r} with --data)"
                            if data else f"{given} holds no rows to predict")
    summary = Summary(rows, bad, output, time.monotonic() - started, first_bad,
                      time.process_time() - cpu)
    if bad and bad / rows > max_bad_fraction:
        raise DataError(f"{bad:,} of {rows:,} rows ({bad / rows:.2%}) could not be predicted, "
                        f"above --max_bad_fraction={max_bad_fraction:g}: the error column of "
                        f"{output} says why for each (first: {first_bad}); fix the input, or "
                        "raise --max_bad_fraction")
    return summary


def check_output(output: str, overwrite: bool) -> None:
    """Raises ConfigError for an output that is not .csv or .jsonl, is a directory, or exists
    (unless `overwrite`)."""
    if not output:
        raise ConfigError("missing required flag --output=FILE.csv or FILE.jsonl")
    if not output.lower().endswith(FORMATS):
        raise ConfigError(f"--output={output} must end in .csv or .jsonl (the format written)")
    if tf.io.gfile.isdir(output):
        raise ConfigError(f"--output={output} is a directory; give a file name, e.g. "
                          f"{posixpath.join(output, 'predictions.csv')}")
    if tf.io.gfile.exists(output) and not overwrite:
        raise ConfigError(f"--output={output} exists; pass --overwrite to replace it, or choose "
                          "another name")
    parent = posixpath.dirname(output)
    if parent and not tf.io.gfile.isdir(parent):
        raise ConfigError(f"--output={output}: its directory {parent} does not exist")


def find_model(model: str) -> tuple[str, str]:
    """`(the SavedModel directory or .tflite file, its run directory)` of `model`: a run
    directory (its export), its export/ (the highest version) or a version in it, or a .tflite
    file in it (quantized/, pruned/). The run's params.yaml says which dataset, pipeline and task
    the model was trained on; a model outside a run is refused."""
    model = model.rstrip("/") or model
    if model.endswith(".tflite"):
        if not tf.io.gfile.exists(model) or tf.io.gfile.isdir(model):
            raise ConfigError(f"--model={model}: no such .tflite file")
        path = model
    elif tf.io.gfile.exists(posixpath.join(model, "params.yaml")):
        return runs.model_path(model, "export"), model
    else:
        path = export.saved_model_dir(model) if tf.io.gfile.isdir(model) else None
        if path is None:
            raise ConfigError(f"--model={model} is not a run directory, a SavedModel (a run's "
                              "export/) or a .tflite file")
    run = run_config.run_of(path)
    if run is None:
        raise ConfigError(f"--model={model} is not inside a tftrain run (no params.yaml beside "
                          "its export/, quantized/ or pruned/): predict reads the run's dataset "
                          "to preprocess rows as training did; pass the run directory")
    return path, run


def read_run(run: str, pipeline_options: dict | None = None):
    """`(task, manifest, pipeline)` of the run directory `run`: the task it trained, its
    dataset's manifest, and the pipeline that encodes rows as its data was converted (with
    `pipeline_options` for reading, and the dataset's assets). The one place predict reads a
    run's params.yaml, through `engine.run_config` as every command that works on a run."""
    config = run_config.read(run)
    data = run_config.RunData(config.data)
    manifest, source = data.manifest(), data.load_kwargs()
    manifest = {**manifest, "info": foreign.decode_info(config.data, manifest.get("info", {}))}
    pipeline = dataset_pipeline(manifest["pipeline"], source.get("pipeline"),
                                source.get("trusted_pipeline"),
                                **{**source.get("pipeline_options", {}),
                                   **(pipeline_options or {})})
    if manifest.get("assets"):  # a tokenizer model: encoding needs it
        pipeline.load_assets(config.data.dir, manifest)
    return run_config.run_task(config), manifest, pipeline


@dataclasses.dataclass(frozen=True)
class Columns:
    """The output's columns (CSV) or keys (JSON Lines), after `input` and the fields passed
    through: a classifier's `class` and `probability` (its most probable class), then
    `class_2`, `probability_2`, ... to `top_k`; a regression's `value` (in the label's units;
    a list for a label of several values); `error` last (empty for a good row)."""

    names: tuple
    top_k: int
    class_names: tuple  # empty: a regression

    @classmethod
    def of(cls, task, info: dict, top_k: int) -> Columns:
        """The columns of `task`'s answers; raises ConfigError for a `top_k` out of range."""
        if task.name != "classification":
            if top_k != 1:
                raise ConfigError(f"--top_k={top_k} is for classifiers; this model's task is "
                                  f"{task.name}")
            return cls(("value",), 1, ())
        count = int(getattr(task, "num_classes", 0) or info.get("num_classes") or 0)
        names = list(info.get("class_names") or [])
        if len(names) != count:
            names = [str(i) for i in range(count)]
        if not 1 <= top_k <= count:
            raise ConfigError(f"--top_k={top_k} must be between 1 and the model's {count} "
                              "classes")
        ranked = [(f"class_{k}", f"probability_{k}") for k in range(2, top_k + 1)]
        return cls(("class", "probability", *itertools.chain(*ranked)), top_k, tuple(names))

    def values(self, scores: np.ndarray | None) -> dict:
        """The answer columns of one row's scores (probabilities or values); empty for None."""
        if scores is None:
            return dict.fromkeys(self.names)
        if not self.class_names:
            flat = [float(v) for v in np.ravel(scores)]
            return {"value": flat[0] if len(flat) == 1 else flat}
        ranked = np.argsort(-scores, kind="stable")[:self.top_k]
        found = {}
        for k, index in enumerate(ranked, start=1):
            suffix = "" if k == 1 else f"_{k}"
            found[f"class{suffix}"] = self.class_names[index]
            found[f"probability{suffix}"] = float(scores[index])
        return found


class Writer:
    """Writes answered rows to an open text file as CSV (the header from the first row's
    passed-through fields; a later row's other fields are left out) or JSON Lines (each row's
    own). A passed-through field named like an answer column gets `_given` appended."""

    def __init__(self, f, output: str, columns: Columns):
        self.f = f
        self.jsonl = output.lower().endswith(".jsonl")
        self.columns = columns
        self.header = None

    def _row(self, item: Item, scores) -> dict:
        taken = {"input", "error", *self.columns.names}
        passed = {(f"{k}_given" if k in taken else k): v for k, v in item.passed.items()}
        return {"input": item.key, **passed, **self.columns.values(scores), "error": item.error}

    def write(self, answered: list[tuple[Item, np.ndarray | None]]) -> None:
        """Writes the rows of one batch."""
        rows = [self._row(item, scores) for item, scores in answered]
        if self.jsonl:
            self.f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
            return
        text = io.StringIO()
        if self.header is None:
            self.header = list(rows[0])
            csv.writer(text, lineterminator="\n").writerow(self.header)
        writer = csv.DictWriter(text, self.header, extrasaction="ignore", lineterminator="\n")
        writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
        self.f.write(text.getvalue())


def raw_items(pipeline, source: str, info: dict):
    """Yields an `Item` per raw row of `source`, encoded by the dataset's pipeline."""
    for row, passed in pipeline.predict_rows(source, info):
        try:
            example = pipeline.encode(row, info)
        except BadRow as e:
            yield Item(row.key, passed, None, first_line(e))
            continue
        if not isinstance(example, bytes):
            example = example.SerializeToString()
        yield Item(row.key, passed, example)


def record_items(data: str, split: str, manifest: dict):
    """Yields an `Item` per record of `data`'s converted `split`, keyed by its index, after
    checking that the records are of the model's dataset kind (its pipeline and features)."""
    found = manifest_lib.read(data)
    if (found.get("pipeline"), found.get("features")) != (manifest.get("pipeline"),
                                                          manifest.get("features")):
        raise ConfigError(f"--data={data} holds records of pipeline {found.get('pipeline')!r}, "
                          f"but the model was trained on pipeline {manifest.get('pipeline')!r} "
                          "records with other features: give the records of its dataset kind")
    files = manifest_lib.shard_files(data, found, split)
    for index, record in enumerate(tf.data.TFRecordDataset(files).as_numpy_iterator()):
        yield Item(str(index), {}, record)


def batched(items, batch_size: int):
    """Yields lists of at most `batch_size` items."""
    items = iter(items)
    while batch := list(itertools.islice(items, batch_size)):
        yield batch


def prefetched(batches):
    """`batches`, each made in a thread while the caller works on the one before (reading and
    encoding rows overlaps the model's run)."""
    batches = iter(batches)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="predict-encode") as pool:
        pending = pool.submit(next, batches, None)
        while (batch := pending.result()) is not None:
            pending = pool.submit(next, batches, None)
            yield batch


def answered_in_order(runner, batches, in_flight: int = IN_FLIGHT):
    """`answer` of each batch, in order, `in_flight` batches run at once: TensorFlow and the
    interpreter release the GIL, so one batch's decode (a single-threaded map over its images)
    overlaps another's model."""
    with concurrent.futures.ThreadPoolExecutor(in_flight, thread_name_prefix="predict") as pool:
        pending = collections.deque()
        for batch in batches:
            pending.append(pool.submit(answer, runner, batch))
            if len(pending) >= in_flight:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def answer(runner, batch: list[Item]) -> list[tuple[Item, np.ndarray | None]]:
    """Each item of `batch` with the model's scores for it (None for a bad row). A batch the
    model's input pipeline refuses (an image whose pixels do not decode) runs again one row at
    a time, and each row it refuses gets the reason."""
    good = [item for item in batch if item.example is not None]
    try:
        scores = iter(runner([item.example for item in good]) if good else [])
    except tf.errors.OpError:
        scores = iter(_one_at_a_time(runner, good))
    answered = []
    for item in batch:
        if item.example is None:
            answered.append((item, None))
            continue
        result = next(scores)
        if isinstance(result, str):
            answered.append((dataclasses.replace(item, error=result), None))
        else:
            answered.append((item, result))
    return answered


def _one_at_a_time(runner, items: list[Item]) -> list:
    """Each item's scores, or the model's reason for refusing it."""
    results = []
    for item in items:
        try:
            results.append(runner([item.example])[0])
        except tf.errors.OpError as e:
            results.append(f"the model's input pipeline refused it: {first_line(e.message)}")
    return results


class SavedModelRunner:
    """A SavedModel's `serving_examples` signature (loaded with `tf.saved_model.load`, which
    runs no Python from the file): serialized Examples -> a classifier's probabilities or a
    regression's values."""

    def __init__(self, path: str):
        export.register_text_ops()
        try:
            self.loaded = tf.saved_model.load(path)
        except Exception as e:  # noqa: BLE001  (a damaged file: TF and protobuf raise many kinds)
            raise TftrainError(f"cannot load the SavedModel at {path}: {first_line(e)}") from None
        self.signature = self.loaded.signatures.get(export.EXAMPLES_SIGNATURE)
        if self.signature is None:
            raise TftrainError(f"the SavedModel at {path} has no {export.EXAMPLES_SIGNATURE} "
                               "signature (an earlier tftrain, or a pipeline whose decode could "
                               "not be exported: its export log says why); train the run again "
                               "with this tftrain, or predict with its .tflite")
        instantiated(lambda examples: self.signature(examples=examples))

    def __call__(self, examples: list[bytes]) -> np.ndarray:
        outputs = self.signature(examples=tf.constant(examples))
        if "probabilities" in outputs:
            return outputs["probabilities"].numpy()
        if len(outputs) != 1:
            raise TftrainError(f"the model has {len(outputs)} outputs ({', '.join(outputs)}); "
                               "predict writes one")
        return next(iter(outputs.values())).numpy()


def instantiated(function):
    """`function` (serialized Examples -> its outputs, a graph) after one call on an empty
    Example, which it may refuse: the first call builds and optimizes the graph (~0.3 s for an
    image decode), now, as the model loads, rather than on the first batch."""
    try:
        function(tf.constant([b""]))
    except tf.errors.OpError:
        pass
    return function


class TfliteRunner:
    """A .tflite model on serialized Examples: parsed and decoded by the reader's own function
    (`reader.batch_decoder`, the dataset's pipeline), run by the LiteRT interpreter with
    `num_threads` threads (default: the cores this process may use); a classifier's outputs
    become probabilities (softmax). The interpreter runs one batch at a time while another
    batch decodes (`answered_in_order`); a smaller batch (the last, or one row at a time) is
    run at its own size, not padded to `batch_size`."""

    def __init__(self, path: str, manifest: dict, pipeline, info: dict, batch_size: int,
                 num_threads: int | None = None, classifier: bool = True):
        schema = reader.parse_spec(manifest.get("features") or pipeline.features(info))
        decode = reader.batch_decoder(schema, pipeline, info)
        self.decode = instantiated(tf.function(decode, autograph=False).get_concrete_function(
            tf.TensorSpec([None], tf.string)))
        self.model = tflite_eval.TfliteModel(path, num_threads or len(os.sched_getaffinity(0)),
                                             batch_size)
        self.lock = threading.Lock()  # one interpreter: one batch at a time (decodes overlap)
        self.classifier = classifier

    def __call__(self, examples: list[bytes]) -> np.ndarray:
        inputs, _ = self.decode(tf.constant(examples))
        inputs = tf.nest.map_structure(np.asarray, inputs)
        with self.lock:
            self.model.resize(len(examples))
            outputs, _ = self.model.run(inputs)
        if self.classifier:
            return tf.nn.softmax(outputs.astype(np.float32)).numpy()
        return outputs

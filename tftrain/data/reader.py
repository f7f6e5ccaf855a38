"""`load`: a fast `tf.data` input pipeline over a tftrain TFRecord dataset."""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import tensorflow as tf
from absl import logging

from pipelines import dataset_pipeline, images, raw_bytes
from tftrain.config_schema import CACHE_MODES
from tftrain.data import augment as augment_lib
from tftrain.data import augment_options, dataset_files
from tftrain.data import manifest as manifest_lib
from tftrain.data import order
from tftrain.errors import ConfigError, DataError

_DTYPES = {"string": tf.string, "int64": tf.int64, "float32": tf.float32}
RECORDS_PER_READ = 64
# What `load` does to each batch, in order; `last_stage` stops after one (`tftrain doctor`).
# "augment" is `data.augment` (training only; without it the same as "decode").
STAGES = ("read", "parse", "decode", "augment")
# The datasets `load` opened in this process: a damaged record met later (in `fit`) is named
# by TensorFlow only by its offset, so the error message names these.
OPENED: dict[str, bool] = {}  # data_dir -> has a manifest (`tftrain inspect --verify` applies)
_DAMAGED_RECORD = re.compile(r"(corrupted|truncated) record at (\d+)")
_TOO_MANY_PIXELS = re.compile(re.escape(images.TOO_MANY_PIXELS) + r"=(\d+)")
_WRONG_RAW_SIZE = re.compile(r"(\w+=raw \w+) " + re.escape(raw_bytes.SIZE_MISMATCH)
                             + r": (\d+) bytes \(([^)]*)\) expected, found\] \[(\d+)")


def damaged_record_message(error: BaseException) -> str | None:
    """One line for TensorFlow's DataLossError on a damaged TFRecord, for an image over the
    pixel limit (`pipelines.images`), or for a raw record (`pipelines.raw_bytes`) of the wrong
    size; None for other errors.

    A damaged checkpoint raises DataLossError too, with other words: it is not taken for data.
    """
    where = " or ".join(OPENED) or "the TFRecords read"
    too_large = (_TOO_MANY_PIXELS.search(str(error))
                 if isinstance(error, tf.errors.InvalidArgumentError) else None)
    if too_large:
        return (f"an image in {where} declares more than max_pixels={too_large.group(1)} pixels "
                "in its header; it was not decoded. Remove it, or, if you trust the data, raise "
                "the limit: --pipeline_options=max_pixels=N when converting, or "
                "data.info={max_pixels: N} for TFRecords of other tools.")
    wrong_size = (_WRONG_RAW_SIZE.search(str(error))
                  if isinstance(error, tf.errors.InvalidArgumentError) else None)
    if wrong_size:
        what, expected, shape, found = wrong_size.groups()
        return (f"a record in {where} does not match its manifest: an {what} of {found} bytes "
                f"where {shape} needs {expected}. The files were changed "
                "after the conversion (`tftrain inspect --verify` checks them against the "
                "manifest); convert the dataset again.")
    found = (_DAMAGED_RECORD.search(str(error))
             if isinstance(error, tf.errors.DataLossError) else None)
    if not found:
        return None
    verify = [f"`tftrain inspect --data={d} --verify`" for d, has_manifest in OPENED.items()
              if has_manifest]
    how = (f"{' and '.join(verify)} names the file and record; restore that file or convert the "
           "dataset again" if verify else "restore the damaged file or write it again")
    return (f"a damaged record in {where}: TensorFlow found a {found.group(1)} record at byte "
            f"{found.group(2)} of one of its files, which cannot be read on; {how}.")


# the loss's words, or `checked_labels`' ("[Received a label value of] [999] [which is ...")
_LABEL_OUT_OF_RANGE = re.compile(r"Received a label value of\]? \[?(-?\d+)\]? \[?which is "
                                 r"outside the valid range of \[0, (\d+)\)")
_SPLIT_WORD = "in the split "  # `checked_labels`' last words, before the split's name
_LABEL_SPLIT = re.compile(r"\[" + _SPLIT_WORD + r"([^\]]+)\]")
_INDEX_OUT_OF_RANGE = re.compile(r"indices\[[\d,]+\] = (-?\d+) is not in \[0, (\d+)\)")
_UNPARSABLE = re.compile(r"Could not parse example input|Data types don't match|"
                         r"Can't parse serialized Example|Feature: \S+ \(data type: \w+\) is required")
_FEATURE_KEY = re.compile(r"(?:Key|Feature): ([\w/.-]+)")


def _tensorflow_message(error: BaseException) -> str | None:
    """The text of TensorFlow's InvalidArgumentError `error`, also when TensorFlow could not
    decode it (it quotes a record's bytes, which need not be UTF-8: Python then gets the
    UnicodeDecodeError of decoding the message, and the message as its `object`)."""
    if isinstance(error, tf.errors.InvalidArgumentError):
        return str(error)
    if isinstance(error, UnicodeDecodeError) and isinstance(error.object, bytes):
        return error.object.decode("utf-8", errors="replace")
    return None


def content_error_message(error: BaseException) -> str | None:
    """One line for a record whose content the model cannot take although its file is intact
    (a label outside the classes, a token id outside the vocabulary, bytes that are not an
    Example of the schema); None for other errors. TensorFlow does not say which record: the
    line names the datasets read and `tftrain inspect --verify`, which does."""
    text = _tensorflow_message(error)
    if text is None:
        return None
    where = " or ".join(OPENED) or "the TFRecords read"
    verify = " and ".join(f"`tftrain inspect --data={d} --verify`"
                          for d, has_manifest in OPENED.items() if has_manifest)
    find = f"{verify} lists the records that hold it" if verify else "find the records that hold it"
    label = _LABEL_OUT_OF_RANGE.search(text)
    if label:
        value, classes = label.groups()
        split = _LABEL_SPLIT.search(text)
        within = f"split {split.group(1)!r} of {where}" if split else where
        if not all(OPENED.values()):  # other tools' TFRecords: data.info says the classes
            return (f"a label of {value} in {within} is outside the {classes} classes [0, "
                    f"{classes}) that data.info={{num_classes: {classes}}} declares: set "
                    "data.info.num_classes above the largest label (ImageNet's 1-based labels "
                    "go to 1000: set data.info={num_classes: 1001}), or fix the records")
        return (f"a label of {value} in {within} is outside the model's {classes} classes "
                f"[0, {classes}): {find}; fix or drop them and convert again (labels are "
                "class indices from 0)")
    index = _INDEX_OUT_OF_RANGE.search(text)
    if index:
        value, size = index.groups()
        return (f"an input id of {value} in {where} is outside the model's range [0, {size}) "
                f"(a token id past the vocabulary, or a category past its count): {find}; "
                "convert the data with the tokenizer the model was built for")
    if _UNPARSABLE.search(text):
        key = _FEATURE_KEY.search(text)
        why = (f"its feature {key.group(1)} has another type or shape" if key
               else "its bytes do not parse, or a feature has another type or shape")
        return (f"a record in {where} is not a tf.train.Example of the dataset's schema ({why}): "
                + find
                + "; convert the data again with tftrain, or describe other tools' records in "
                "data.info")
    return None


def parse_spec(features: dict) -> dict:
    """The `tf.io.parse_example` spec for a manifest's feature schema."""
    spec = {}
    for name, feature in features.items():
        dtype = _DTYPES[feature["dtype"]]
        if feature.get("varlen"):
            spec[name] = tf.io.RaggedFeature(dtype)
        else:
            spec[name] = tf.io.FixedLenFeature(feature["shape"], dtype, feature.get("default"))
    return spec


def features_reached(spec: dict, pipeline, info: dict, part: str = "all") -> set[str]:
    """The features of `spec` on which `pipeline.decode`'s outputs depend: `part` "all" (inputs
    and label) or "inputs". Found by tracing `decode` once on a parsed batch and walking its
    graph back from those outputs and its stateful ops, through data and control inputs."""
    parsed = {}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def decoded(serialized):
        parsed.update(tf.io.parse_example(serialized, spec))
        inputs, label = pipeline.decode(dict(parsed), info)
        return tf.nest.flatten(inputs if part == "inputs" else (inputs, label),
                               expand_composites=True)

    graph = decoded.get_concrete_function().graph
    tensors, ops = set(), set()
    pending = list(graph.outputs) + ([] if part == "inputs" else list(graph.control_outputs))
    while pending:
        item = pending.pop()
        if isinstance(item, tf.Tensor):
            if item.name not in tensors:
                tensors.add(item.name)
                pending.append(item.op)
        elif item.name not in ops:
            ops.add(item.name)
            pending.extend(item.inputs)
            for control in item.control_inputs:
                if control.type.startswith("ParseExample"):  # waits on the whole parse
                    return set(parsed)
                pending.append(control)
    return {name for name, value in parsed.items()
            if any(t.name in tensors for t in tf.nest.flatten(value, expand_composites=True))}


def batch_decoder(schema: dict, pipeline, info: dict, last_stage: str = "augment",
                  label_key: str | None = None, split: str = ""):
    """The function `load` maps over batches of serialized records: `tf.io.parse_example` of the
    features of `schema` that the decoded `(inputs, label)` depend on (`features_reached`: every
    other one, e.g. image/filename, would cost a copy per example for nothing), then
    `pipeline.decode`. `last_stage` (one of STAGES) stops after reading or parsing. Class
    labels (`label_key`'s stored values, else the decoded label) are checked to lie in
    [0, info's num_classes) first (`checked_labels`; `split` names the split in its error).
    The function takes an optional second argument, keys added to `info` for this batch's
    decode (the augment stage's random crop)."""
    reached = features_reached(schema, pipeline, info) if last_stage != "read" else set()
    spec = {name: feature for name, feature in schema.items() if name in reached} or schema

    @tf.autograph.experimental.do_not_convert  # plain TF ops; AutoGraph only warns about closures
    def parse_and_decode(serialized, extra_info=None):
        if last_stage == "read":
            return serialized
        features = tf.io.parse_example(serialized, spec)
        if last_stage == "parse":
            return features
        classes = info.get("num_classes")
        if label_key in features:  # the stored values, before a decode narrows their type
            features[label_key] = checked_labels(features[label_key], classes, split)
            classes = None
        inputs, label = pipeline.decode({**unparsed_stand_ins(schema, spec, serialized),
                                         **features}, {**info, **(extra_info or {})})
        return inputs, checked_labels(label, classes, split)

    return parse_and_decode


def checked_labels(label, classes, split: str = ""):
    """`label`, read only after every class label in it was checked to lie in [0, `classes`):
    an evaluation or a quantized model's measurement, which computes no loss, would otherwise
    count a damaged label as a wrong answer. Fails the read with TensorFlow's own words for it,
    and the name of the `split` read (`content_error_message` makes the line); other labels
    pass unchecked."""
    if (not isinstance(classes, int) or classes < 1 or not isinstance(label, tf.Tensor)
            or not label.dtype.is_integer):
        return label
    outside = tf.logical_or(label < 0, label >= classes)
    check = tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(outside)),
        ["Received a label value of", tf.boolean_mask(label, outside)[:1],
         f"which is outside the valid range of [0, {classes})", f"{_SPLIT_WORD}{split}"])
    with tf.control_dependencies([check]):
        return tf.identity(label)


def unparsed_stand_ins(schema: dict, parsed: dict, serialized: tf.Tensor) -> dict:
    """Zeros for the features of `schema` left out of `parsed` (no output depends on them), so
    a decode that looks them up still finds a value of their type and shape."""
    batch = tf.shape(serialized, out_type=tf.int64)[0]
    stand_ins = {}
    for name, feature in schema.items():
        if name in parsed:
            continue
        if isinstance(feature, tf.io.RaggedFeature):
            stand_ins[name] = tf.RaggedTensor.from_row_lengths(
                tf.zeros([0], feature.dtype), tf.zeros([batch], tf.int64))
        else:
            stand_ins[name] = tf.zeros(tf.concat([[batch], tf.constant(feature.shape, tf.int64)], 0),
                                       feature.dtype)
    return stand_ins


def foreign_files(pattern: str, split: str) -> list[str]:
    """The TFRecord files of `split` in a dataset that tftrain did not write (no manifest).

    `pattern` is a glob; `{split}` in it is replaced by the split name. A directory stands for
    its files whose names start with the split name (`train-00000-of-00010`, `train.tfrecord`).
    """
    if "{split}" in pattern:
        pattern = pattern.replace("{split}", split)
    elif tf.io.gfile.isdir(pattern):
        pattern = manifest_lib.join(pattern, split + "*")
    files = sorted(tf.io.gfile.glob(pattern))
    if not files:
        raise DataError(f"no TFRecord files match {pattern!r} (split {split!r}); pass a glob such as "
                        "'/data/{split}-*.tfrecord' or a directory of <split>-* files.")
    return files


def load(data_dir: str, split: str, batch_size: int, training: bool, *,
         input_context: tf.distribute.InputContext | None = None, shuffle_buffer: int = 10_000,
         cache: str = "none", drop_remainder: bool | None = None, repeat: bool = False,
         seed: int | None = None, pipeline: str | None = None,
         pipeline_options: dict | None = None, info: dict | None = None,
         service_address: str = "", service_mode: str = "parallel_epochs",
         deterministic: bool | None = None, last_stage: str = "augment",
         start_batch: int = 0, autotune: bool = True, trusted_pipeline: str | None = None,
         shard_sets: Sequence[tuple[int, Sequence[str]]] = (),
         worker_slice: WorkerSlice | None = None, label_weights: Sequence[float] | None = None,
         augment: dict | None = None) -> tf.data.Dataset:
    """Returns a batched dataset of `(inputs, label)` read from `data_dir`'s `split`.

    `batch_size` is the size of the batches this pipeline yields. Under a strategy, use
    `load_distributed`, which turns the global batch into the per-replica batch (the one place that
    does) and passes `input_context`; the pipeline then reads only its share of the data: whole
    shard files when there are at least as many files as input pipelines, else every n-th example
    (with a warning). Evaluation reads in file order. Training reads in passes: pass p shuffles the
    shard files and then the examples with a seed mixed from (`seed`, p) (`tftrain.data.order`),
    files read in parallel, so the order is a function of the seed alone (not of TF's global seed,
    with `repeat`): every iterator, every worker and every restart sees the same batches. With
    `repeat`, the passes follow one another forever and `start_batch` (how many batches of this
    pipeline were consumed before a resume) starts the stream right after them: the skipped records
    of the current pass are read but not parsed, the earlier passes not read at all. `shard_sets`
    (with `repeat`; `(from_batch, shard file names)`, the first from 0) reads each set of the
    split's shards from the first pass boundary at or after its `from_batch` on: a run resumed
    after `tftrain convert --append` (`tftrain.data.passes`) finishes its pass on the shards it had
    and reads the new ones from the next. Without `repeat`, training yields one pass, reshuffled
    each time it is iterated. `deterministic=False` lets the parallel reads and maps hand over
    elements out of order (the order is then not exact). Examples are batched first and then parsed
    and decoded a batch at a time; only the features that the decoded `(inputs, label)` depend on
    are parsed (`batch_decoder`). `autotune=False` turns tf.data's autotuning off: the parallel
    reads and maps then run as many calls as there are cores from the start, which a small host (2
    cores) reads faster with.

    `cache`: "records" keeps the serialized examples in memory after the first pass (no file reads
    after it); "decoded" keeps the decoded examples (no reads and no decoding after the first pass,
    at the memory of decoded tensors: 12 KiB per 32x32x3 float32 image), and needs a pipeline whose
    decoded examples have a fixed shape.

    Foreign TFRecords: when `data_dir` has no dataset.json and `pipeline` (a pipeline name) is
    given, `data_dir` is a file pattern (see `foreign_files`), the schema is
    `pipeline.features(info)`, and `info` stands in for the manifest's metadata. The pipeline is
    built with `pipeline_options` (e.g. {"image_size": 64}). The pipeline a dataset.json names is
    imported only when it is built in or is `trusted_pipeline` (the user's `data.pipeline`): a
    dataset does not choose the code that runs.

    tf.data service: with `service_address` (a dispatcher's host:port) the whole pipeline runs on
    the service's workers in `service_mode` (see `tftrain.data.service`). `last_stage` (one of
    STAGES) truncates the pipeline: "read" yields batches of serialized records, "parse" their
    parsed features, "decode" `(inputs, label)` unaugmented, "augment" (the default) with `augment`
    applied. `worker_slice`: one worker's part of each batch (taken before parsing; a pipeline
    run's workers read the same batches, each trains on its part). `label_weights` (one per class
    id, `train.class_weight`): `(inputs, label, sample_weight)`. `augment` (`data.augment`):
    training batches go through `tftrain.data.augment`'s stage, after any cache; every other read
    decodes as `Augment.decode_info` says.
    """
    options = ReadOptions(
        training=training, shuffle_buffer=shuffle_buffer, cache=cache,
        drop_remainder=training if drop_remainder is None else drop_remainder, repeat=repeat,
        seed=seed, deterministic=True if deterministic is None else deterministic,
        last_stage=last_stage, start_batch=start_batch, autotune=autotune,
        service_address=service_address, service_mode=service_mode)
    options.check()
    source = open_split(data_dir, split, pipeline, pipeline_options, info, trusted_pipeline)
    shares = [(from_batch, Share.of(part.files, input_context, split), part)
              for from_batch, part in _shard_sets(source, shard_sets, options)]
    for file in {file for _, share, _ in shares for file in share.files}:  # before TF opens them
        dataset_files.check(file, source.directory, source.sizes.get(file))
    if training and options.seed is None:  # a random order (repeatable under TF's global seed)
        options = dataclasses.replace(options, seed=int(tf.random.uniform([], 1, 2**31 - 1,
                                                                          tf.int64)))
    stage, parse_and_decode = _stage_and_decoder(source, augment_options.parse(augment), options,
                                                 input_context, worker_slice, split)
    examples = _examples(options, shares, parse_and_decode, batch_size)
    dataset = examples.batch(batch_size, drop_remainder=options.drop_remainder)
    dataset = _with_known_size(dataset, options, source, input_context, batch_size)
    dataset = dataset.map(worker_slice.of) if worker_slice else dataset
    dataset = _decoded(dataset, options, parse_and_decode, label_weights, stage)
    return _finished(dataset, options, input_context)


def _stage_and_decoder(source: Source, augmenting: augment_options.Augment,
                       options: ReadOptions, input_context, worker_slice, split: str):
    """The augment stage (`_augment_stage`) and the `batch_decoder` of `source`'s `split`. Every
    decode but the augment stage's crops as evaluation does (`Augment.decode_info`; the stage's
    random crop replaces it), but the decoded cache of an augmented input, which keeps whole
    images for the stage to crop."""
    stage = _augment_stage(source, augmenting, options, input_context, worker_slice)
    info = (source.info if stage and options.cache == "decoded"
            else augmenting.decode_info(source.info))
    return stage, batch_decoder(
        parse_spec(source.manifest.get("features") or source.pipeline.features(source.info)),
        source.pipeline, info, options.last_stage, source.manifest.get("label_key"), split)


def _augment_stage(source: Source, augmenting: augment_options.Augment, options: ReadOptions,
                   input_context, worker_slice) -> augment_lib.Stage | None:
    """The augment stage of a training input with `data.augment` (None for evaluation, a
    truncated pipeline, or nothing to do); a ConfigError when the pipeline decodes no images
    (also for evaluation, whose decode crops with `random_resized_crop`)."""
    if not augmenting.active:
        return None
    shape = source.pipeline.image_shape(source.info)
    if shape is None:
        raise ConfigError(f"data.augment transforms images, and pipeline "
                          f"{source.pipeline.name!r} does not decode images "
                          "(pipelines.images.decode_image_batch): remove data.augment")
    if not options.training or options.last_stage != "augment":
        return None
    # worker slices of one batch are distinct examples: each draws its own
    pipeline_id = ((input_context.input_pipeline_id if input_context else 0) * 1024
                   + (worker_slice.index if worker_slice else 0))
    return augment_lib.Stage(augmenting, options.seed, tuple(shape),
                             _classes_to_mix(source, augmenting), pipeline_id)


def _classes_to_mix(source: Source, augmenting: augment_options.Augment) -> int | None:
    """The number of classes mixup/cutmix make soft targets over (None: no mixing)."""
    if not augmenting.mixes:
        return None
    count = source.info.get("num_classes")
    if not isinstance(count, int) or count < 1:
        raise DataError("data.augment's mixup/cutmix need the number of classes, and the "
                        "dataset names none: convert the label as classes, or give "
                        "data.info={num_classes: K} for other tools' TFRecords")
    return count


def _decoded(dataset: tf.data.Dataset, options: ReadOptions, parse_and_decode,
             label_weights: Sequence[float] | None,
             stage: augment_lib.Stage | None = None) -> tf.data.Dataset:
    """Batches of records parsed and decoded (`cache=decoded` did it before batching), each
    example given its label's entry of `label_weights` as its sample weight when they are given
    and the batches are decoded; augmented by `stage` when given."""
    if stage is not None:
        return stage.apply(dataset, options.start_batch,
                           None if options.cache == "decoded" else parse_and_decode,
                           label_weights, options.deterministic)
    if options.cache != "decoded":
        dataset = dataset.map(parse_and_decode, num_parallel_calls=tf.data.AUTOTUNE,
                              deterministic=options.deterministic)
    if label_weights is not None and options.last_stage in ("decode", "augment"):
        dataset = dataset.map(weighted_by_label(label_weights))
    return dataset


def weighted_by_label(label_weights: Sequence[float]):
    """The map from a batch `(inputs, label)` to `(inputs, label, sample_weight)`: each
    example's weight is `label_weights[its label]` (a scalar integer label per example)."""
    @tf.autograph.experimental.do_not_convert  # plain TF ops
    def weighted(inputs, label):
        return inputs, label, augment_lib.label_weights_of(label_weights, label)

    return weighted


@dataclasses.dataclass(frozen=True)
class WorkerSlice:
    """Worker `index` of `count`'s part of batches made of `groups` equal groups (accumulated
    gradients' batches): in each group, the `index`-th of `count` equal consecutive parts."""

    index: int
    count: int
    groups: int = 1

    def of(self, batch):
        """This worker's part of every tensor of `batch` (batch-major, any structure)."""
        def part(tensor):
            grouped = tf.reshape(tensor, tf.concat([[self.groups, self.count, -1],
                                                    tf.shape(tensor)[1:]], axis=0))
            mine = tf.reshape(grouped[:, self.index], tf.concat([[-1], tf.shape(tensor)[1:]], 0))
            size = tensor.shape[0]
            mine.set_shape([size // self.count if size is not None else None, *tensor.shape[1:]])
            return mine
        return tf.nest.map_structure(part, batch)


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """`load`'s options, resolved (`drop_remainder` and `deterministic` no longer None)."""

    training: bool
    shuffle_buffer: int = 10_000
    cache: str = "none"
    drop_remainder: bool = False
    repeat: bool = False
    seed: int | None = None
    deterministic: bool = True
    last_stage: str = "augment"
    start_batch: int = 0
    autotune: bool = True
    service_address: str = ""
    service_mode: str = "parallel_epochs"

    def check(self) -> None:
        """Raises DataError for an option no pipeline can have."""
        if self.last_stage not in STAGES:
            raise DataError(f"last_stage={self.last_stage!r} is not one of {', '.join(STAGES)}")
        if self.cache not in CACHE_MODES:
            raise DataError(f"cache={self.cache!r} is not one of {', '.join(CACHE_MODES)}")
        if self.start_batch and not (self.training and self.repeat):
            raise DataError("start_batch needs a repeated training input (training=True, "
                            "repeat=True)")


@dataclasses.dataclass(frozen=True)
class Source:
    """What is read: the split's files, the manifest (or what stands in for it), the pipeline."""

    files: list
    manifest: dict
    directory: str | None  # the dataset directory (None: other tools' TFRecords)
    sizes: dict  # file -> its size in bytes, as the manifest records it
    pipeline: object
    info: dict
    record_counts: list  # per file, None where unknown
    num_examples: int | None  # of the split, None when unknown


def open_split(data_dir: str, split: str, pipeline: str | None, pipeline_options: dict | None,
               info: dict | None, trusted_pipeline: str | None) -> Source:
    """The split's `Source`: a tftrain dataset's manifest and shards, or (with `pipeline` and
    no dataset.json) other tools' TFRecords matched by `data_dir` as a pattern."""
    if pipeline and not manifest_lib.exists(data_dir):
        files = foreign_files(data_dir, split)
        manifest = {"pipeline": pipeline, "info": info or {}}
        directory, sizes = None, {}
    else:
        manifest = manifest_lib.read(data_dir)
        files = manifest_lib.shard_files(data_dir, manifest, split)
        directory, sizes = data_dir, manifest_lib.shard_sizes(data_dir, manifest, split)
    OPENED[data_dir] = "splits" in manifest
    chosen = dataset_pipeline(manifest["pipeline"], pipeline, trusted_pipeline,
                              **(pipeline_options or {}))
    entry = manifest.get("splits", {}).get(split, {})
    counts = [shard.get("num_examples") for shard in entry.get("shards", [{}] * len(files))]
    return Source(files, manifest, directory, sizes, chosen, manifest.get("info", {}), counts,
                  entry.get("num_examples"))


def _shard_sets(source: Source, shard_sets, options: ReadOptions) -> list[tuple[int, Source]]:
    """`(from_batch, source reading only that set's shards)` for each of `shard_sets`; the
    whole split from batch 0 without them. Raises DataError for a shard the split lacks."""
    if not shard_sets:
        return [(0, source)]
    if not (options.training and options.repeat):
        raise DataError("shard_sets need a repeated training input (training=True, repeat=True)")
    if source.directory is None:
        raise DataError("shard_sets name shards of a tftrain dataset; other tools' TFRecords "
                        "have no manifest to name them in")
    counts = dict(zip(source.files, source.record_counts))
    parts = []
    for from_batch, names in shard_sets:
        files = [manifest_lib.join(source.directory, name) for name in names]
        missing = [file for file in files if file not in counts]
        if missing:
            raise DataError(f"{missing[0]} is not a shard of this split in the manifest of "
                            f"{source.directory}")
        parts.append((from_batch, dataclasses.replace(
            source, files=files, record_counts=[counts[file] for file in files],
            num_examples=None)))
    return parts


@dataclasses.dataclass(frozen=True)
class Share:
    """The files one input pipeline reads: whole files when there are at least as many as input
    pipelines (`by_file`), else all of them, keeping every n-th record."""

    files: list
    by_file: bool
    num_pipelines: int
    pipeline_id: int

    @classmethod
    def of(cls, files: list, input_context, split: str) -> Share:
        """The share of the pipeline `input_context` names (all files without one)."""
        num_pipelines = input_context.num_input_pipelines if input_context else 1
        pipeline_id = input_context.input_pipeline_id if input_context else 0
        by_file = len(files) >= num_pipelines
        if not by_file:
            logging.warning(
                "split %r has %d shard files for %d input pipelines: sharding by example (every "
                "worker reads all files). Convert with --num_shards >= %d to shard by file.",
                split, len(files), num_pipelines, num_pipelines)
        own = files[pipeline_id::num_pipelines] if by_file else files
        return cls(own, by_file, num_pipelines, pipeline_id)


def _records(share: Share, deterministic: bool, file_seed=None,
             reshuffle: bool = False) -> tf.data.Dataset:
    """The share's serialized records, its files in order or shuffled by `file_seed`."""
    dataset = tf.data.Dataset.from_tensor_slices(share.files)
    if file_seed is not None:
        dataset = dataset.shuffle(len(share.files), seed=file_seed,
                                  reshuffle_each_iteration=reshuffle)
    # Each file is read RECORDS_PER_READ records at a time and unbatched: the parallel
    # interleave then hands over one element per 64 records (cheaper than one per record).
    dataset = dataset.interleave(
        tf.autograph.experimental.do_not_convert(
            lambda file: tf.data.TFRecordDataset(file).batch(RECORDS_PER_READ)),
        cycle_length=min(len(share.files), 16) or 1, num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic).unbatch()
    return dataset if share.by_file else dataset.shard(share.num_pipelines, share.pipeline_id)


def _examples(options: ReadOptions, shares: list, parse_and_decode,
              batch_size: int) -> tf.data.Dataset:
    """The examples in reading order, before batching: records (or, with `cache=decoded`,
    decoded examples), cached, shuffled per pass and streamed from `start_batch` as asked.
    `shares`: `(from_batch, Share, Source)` per set of shards (see `load`'s `shard_sets`)."""
    segments = [order.Segment(_one_pass(options, share, source, parse_and_decode),
                              _records_per_pass(share, source), from_batch * batch_size)
                for from_batch, share, source in shares]
    if options.training and options.repeat:
        return order.stream(segments, options.start_batch * batch_size)
    if options.training:  # one pass, reshuffled each time it is iterated
        return segments[0].one_pass(0, reshuffle=True)
    _, share, source = shares[0]
    dataset = _cached_source(options, share, source, parse_and_decode)()
    return dataset.repeat() if options.repeat else dataset


def _one_pass(options: ReadOptions, share: Share, source: Source, parse_and_decode):
    """`one_pass(index, reshuffle=False)`: training pass `index` of `share`, its files and
    records shuffled with the pass's own seed."""
    read = _cached_source(options, share, source, parse_and_decode)

    def one_pass(index, reshuffle=False) -> tf.data.Dataset:
        pass_seed = order.pass_seed(options.seed, index)
        return read(pass_seed, reshuffle).shuffle(options.shuffle_buffer, seed=pass_seed,
                                                  reshuffle_each_iteration=reshuffle)
    return one_pass


def _records_per_pass(share: Share, source: Source):
    """`records()`: how many records one pass of `share` yields (counted when first asked)."""
    return lambda: order.records_per_pipeline(source.record_counts, source.files,
                                              share.num_pipelines, share.pipeline_id,
                                              share.by_file)


def _cached_source(options: ReadOptions, share: Share, source: Source, parse_and_decode):
    """`read(file_seed=None, reshuffle=False)`: the share's records, read from the files each
    time, or (with `cache`) in one file order kept in memory after the first pass (training
    reshuffles the records)."""
    if options.cache == "none":
        return lambda file_seed=None, reshuffle=False: _records(
            share, options.deterministic, file_seed, reshuffle)
    kept = _records(share, options.deterministic,
                    order.pass_seed(options.seed, 0) if options.training else None)
    if options.cache == "decoded":  # decoded in batches as usual, then kept one at a time
        kept = kept.batch(RECORDS_PER_READ).map(
            parse_and_decode, num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=options.deterministic).unbatch()
        check_fixed_shapes(kept, source.pipeline.name)
    kept = kept.cache()
    return lambda file_seed=None, reshuffle=False: kept


def _with_known_size(dataset: tf.data.Dataset, options: ReadOptions, source: Source,
                     input_context, batch_size: int) -> tf.data.Dataset:
    """`dataset` with its number of batches asserted when the manifest knows it (a known size
    lets Keras evaluate with steps_per_execution > 1 without a step count)."""
    num_examples = source.num_examples
    sharded = input_context is not None and input_context.num_input_pipelines > 1
    if num_examples is None or options.repeat or sharded:
        return dataset
    batches = (num_examples // batch_size if options.drop_remainder
               else -(-num_examples // batch_size))
    return dataset.apply(tf.data.experimental.assert_cardinality(batches))


def _finished(dataset: tf.data.Dataset, options: ReadOptions, input_context) -> tf.data.Dataset:
    """The tf.data service (everything above runs on its workers), the dataset's options, and
    prefetching."""
    if options.service_address:
        from tftrain.data import service as data_service

        dataset = data_service.distribute(dataset, options.service_address, options.service_mode)
    tf_options = tf.data.Options()
    # Parallelism comes from the parallel interleave and map (and the decode loop); intra-op
    # thread pools only add hand-offs to the many small ops of an input pipeline.
    tf_options.threading.max_intra_op_parallelism = 1
    tf_options.deterministic = options.deterministic
    if not options.autotune:  # AUTOTUNE then takes TF's fixed defaults (parallel calls: the cores)
        tf_options.autotune.enabled = False
    if input_context is not None:  # sharded above: the strategy must not shard again
        tf_options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF)
    return dataset.with_options(tf_options).prefetch(tf.data.AUTOTUNE)


def replayed(dataset: tf.data.Dataset, batches: int) -> tf.data.Dataset:
    """The first `batches` elements of `dataset`, read once here and then repeated from memory
    forever (what `tftrain doctor` times a model alone on: no reading or decoding)."""
    kept = dataset.take(batches).cache()
    for _ in kept:  # one complete pass: the cache is final and every later pass reads memory
        pass
    return kept.repeat()


def check_fixed_shapes(dataset: tf.data.Dataset, pipeline_name: str) -> None:
    """Raises unless every decoded example has a fully known shape (so batches can be re-made)."""
    for spec in tf.nest.flatten(dataset.element_spec):
        if not spec.shape.is_fully_defined():
            raise DataError(
                f"data.cache=decoded needs decoded examples of a fixed shape, but pipeline "
                f"{pipeline_name!r} yields {spec.shape}; use data.cache=records instead.")


def load_distributed(strategy: tf.distribute.Strategy, data_dir: str, split: str,
                     global_batch_size: int, training: bool, start_step: int = 0,
                     shard_sets: Sequence[tuple[int, Sequence[str]]] = (), **kwargs):
    """`load` for `strategy`: the one place where the global batch size is split over replicas.

    `global_batch_size` counts examples over all replicas and workers and must divide evenly.
    Training: every input pipeline (one per worker) reads its own shard of the files and yields
    per-replica batches (`distribute_datasets_from_function`); repeat it and pass
    `steps_per_epoch`. Evaluation: one dataset of global batches that Keras splits over the
    replicas itself (sharding it automatically across workers), so no step count is needed and
    the last partial batch is kept. Static shapes (TPU) need `drop_remainder=True`.
    `start_step` (training, with `repeat=True`): the steps a resumed run already made; every
    pipeline starts after the per-replica batches its replicas consumed in them. `shard_sets`:
    `(from_step, shard names)` (see `load`, which counts them in its own batches).
    `kwargs` go to `load`.
    """
    replicas = strategy.num_replicas_in_sync
    if global_batch_size % replicas:
        raise DataError(f"batch size {global_batch_size} does not split over {replicas} replicas; "
                        "choose a multiple of the replica count")
    if not training:
        dataset = load(data_dir, split, global_batch_size, training, **kwargs)
        return _shard_by_example_across_workers(dataset, input_workers(strategy))

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        # Each step takes one batch per replica, consecutive batches of its worker's pipeline.
        replicas_per_pipeline = replicas // input_context.num_input_pipelines
        return load(data_dir, split, input_context.get_per_replica_batch_size(global_batch_size),
                    training, input_context=input_context,
                    start_batch=start_step * replicas_per_pipeline,
                    shard_sets=in_batches(shard_sets, replicas_per_pipeline), **kwargs)

    return strategy.distribute_datasets_from_function(dataset_fn)


def in_batches(shard_sets: Sequence[tuple[int, Sequence[str]]], batches_per_step: int) -> list:
    """`shard_sets` counted in steps, counted in the batches of one input pipeline."""
    return [(from_step * batches_per_step, names) for from_step, names in shard_sets]


def input_workers(strategy: tf.distribute.Strategy) -> int:
    """How many workers run an input pipeline of `strategy`, read from its public API: in a
    multi-worker run the cluster's workers (chief included), as `tftrain.runtime.cluster`
    counts them; 1 on one machine.

    Only a strategy with a cluster resolver can span workers. MultiWorkerMirroredStrategy runs
    one program per worker, each with the same number of local devices (`worker_devices`), so
    its replicas over those devices is the worker count. TPUStrategy's `worker_devices` are all
    of its replicas (one program feeds every host): 1, as before.
    """
    if strategy.cluster_resolver is None:  # default, one-device and mirrored strategies
        return 1
    return max(1, strategy.num_replicas_in_sync // max(1, len(strategy.extended.worker_devices)))


def _shard_by_example_across_workers(dataset: tf.data.Dataset, workers: int) -> tf.data.Dataset:
    """Multi-worker evaluation: shard by example (DATA), which works with any number of files.

    Automatic FILE sharding fails outright when a split has fewer files than workers. On one
    worker (`workers`, see `input_workers`) the dataset is left as it is: there is nothing to
    shard, and TensorFlow would still rewrite a DATA-sharded pipeline's per-replica rebatching.
    """
    if workers <= 1:
        return dataset
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)

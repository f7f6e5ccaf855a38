"""Training on TFRecords that tftrain did not write (`data.format: tfrecord`).

Such a directory has no dataset.json, so the config says what a manifest would: the pipeline
whose schema the records follow (`data.pipeline`, built with `data.pipeline_options`) and the
metadata its decode and the model need (`data.info`, e.g. `{num_classes: 10}`). Files are found
per split by `reader.foreign_files` (a directory of `<split>-*` files, or a glob with
`{split}`). Nothing is ever written into that directory.
"""
from __future__ import annotations

from absl import logging

from tftrain.data import augment_options
from tftrain.errors import DataError


def load_kwargs(data) -> dict:
    """The keyword arguments of `tftrain.data.load` that read `data` (a `DataConfig`) as the
    config describes it: for a tftrain dataset (its manifest says everything else), only that
    the config's `data.pipeline` is trusted when the manifest names it. Both carry
    `data.augment` (training augments; every other read decodes as validation does)."""
    if data.format != "tfrecord":
        return {"trusted_pipeline": data.pipeline, "augment": dict(data.augment)}
    return {"pipeline": data.pipeline, "pipeline_options": dict(data.pipeline_options),
            "info": dict(data.info), "augment": dict(data.augment)}


def decode_info(data, info: dict) -> dict:
    """The dataset's `info` (its manifest's) as every decode of `data` (a `DataConfig`) but
    the training input's receives it, the same as `tftrain.data.load` gives it for
    evaluation: with `data.augment.random_resized_crop`, the center crop
    (`augment_options.Augment.decode_info`), so an exported or served model sees what
    validation saw."""
    return augment_options.parse(data.augment).decode_info(info)


def read_manifest(data) -> dict:
    """The manifest of `data` (a `DataConfig`): dataset.json for a tftrain dataset, else what
    `describe` finds for its train, eval and test splits."""
    if data.format != "tfrecord":
        from tftrain.data import manifest as manifest_lib

        return manifest_lib.read(data.dir)
    return describe(data, [data.train_split, data.eval_split, data.test_split])


def describe(data, splits: list[str], count: bool = True) -> dict:
    """A manifest-like dict for foreign TFRecords: pipeline, info, features, and per split its
    files and (when `count`) its number of records, counted by reading the files once.

    Raises DataError naming the split and the pattern when a split has no files.
    """
    import tensorflow as tf

    from pipelines import load_pipeline
    from tftrain.data import dataset_files, reader

    pipeline = load_pipeline(data.pipeline, **data.pipeline_options)
    entries = {}
    for split in dict.fromkeys(splits):
        files = reader.foreign_files(data.dir, split)
        entry = {"shards": [{"file": f} for f in files]}
        if count:
            try:
                counts = [dataset_files.check(file, None) for file in files]
                entry["num_examples"] = (sum(counts) if None not in counts else int(
                    tf.data.TFRecordDataset(files).reduce(tf.constant(0, tf.int64),
                                                          lambda n, _: n + 1)))
            except tf.errors.OpError as e:
                raise DataError(f"cannot read the {split!r} TFRecord files under {data.dir}: "
                                f"{e.message.splitlines()[0]}") from None
            logging.info("data.format=tfrecord: %s has %s records in %d file(s)", split,
                         f"{entry['num_examples']:,}", len(files))
        entries[split] = entry
    return {"pipeline": pipeline.name, "info": dict(data.info), "splits": entries,
            "features": pipeline.features(dict(data.info)), "format": "tfrecord"}

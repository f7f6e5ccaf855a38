"""`tftrain train`: config -> strategy -> data -> model -> fit -> evaluate -> export.

Read top to bottom, `train()` is the whole story of one run.
"""
from __future__ import annotations

import sys
import time

import tensorflow as tf
import tf_keras as keras
from absl import logging

from pipelines import load_pipeline
from tftrain import config as config_lib
from tftrain import data as data_lib
from tftrain import distribute, models, precision, run_dir
from tftrain.data import manifest as manifest_lib
from tftrain.data.writer import write_dataset
from tftrain.fileio import join, remove, write_json, write_text_atomic


def train(config: config_lib.Config, model_dir: str, *, overwrite: bool = False) -> dict:
    """Trains, evaluates and exports one model; returns the summary written to summary.json."""
    # 1. The strategy comes first: no TensorFlow op may run before it is built.
    strategy = distribute.create_strategy(config.runtime)
    num_replicas = strategy.num_replicas_in_sync
    config_lib.check_divisible(config.data.batch_size, num_replicas)

    run_dir.prepare(model_dir, overwrite)
    write_text_atomic(join(model_dir, run_dir.PARAMS), config_lib.to_yaml(config))
    keras.utils.set_random_seed(config.train.seed)
    policy = precision.set_policy(config.runtime.mixed_precision, strategy)

    # 2. Data: converted the first time it is needed, then read from its TFRecord shards.
    manifest = ensure_dataset(config.data)
    train_data, steps_per_epoch = make_train_dataset(config, manifest, strategy)
    eval_data = data_lib.load(config.data.dir, config.data.eval_split, config.data.batch_size,
                              training=False)

    # 3. Model, built and compiled inside the strategy's scope.
    input_shape = eval_data.element_spec[0].shape[1:]
    with strategy.scope():
        model = models.build_model(config.model.name, config.model.params, input_shape,
                                   manifest["info"]["num_classes"])
        model.compile(optimizer=make_optimizer(config.train),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=config.train.steps_per_execution)

    # 4. Fit.
    started = time.monotonic()
    history = model.fit(train_data, epochs=config.train.epochs, steps_per_epoch=steps_per_epoch,
                        validation_data=eval_data, callbacks=make_callbacks(model_dir),
                        verbose=1 if sys.stdout.isatty() else 2)
    seconds = time.monotonic() - started
    epochs_run = len(history.history.get("loss", []))

    # 5. Evaluate on the test split, export, and summarize.
    test_data = data_lib.load(config.data.dir, config.data.test_split, config.data.batch_size,
                              training=False)
    test_metrics = model.evaluate(test_data, return_dict=True, verbose=0)
    export(model, join(model_dir, run_dir.EXPORT))
    summary = {
        "model_dir": model_dir,
        "data_dir": config.data.dir,
        "epochs": epochs_run,
        "eval": {"split": config.data.test_split, **{k: float(v) for k, v in test_metrics.items()}},
        "validation": {k[4:]: float(v[-1]) for k, v in history.history.items() if k.startswith("val_")},
        "strategy": distribute.strategy_name(strategy),
        "num_replicas": num_replicas,
        "mixed_precision": policy,
        "examples_per_second": steps_per_epoch * epochs_run * config.data.batch_size / seconds,
    }
    write_json(join(model_dir, run_dir.SUMMARY), summary)
    return summary


def ensure_dataset(data: config_lib.DataConfig) -> dict:
    """Reads the dataset's manifest, converting the raw source first if there is none yet."""
    if not manifest_lib.exists(data.dir):
        logging.info("no dataset in %s yet: converting with pipeline %r", data.dir, data.pipeline)
        write_dataset(load_pipeline(data.pipeline), data.source, data.dir)
    return manifest_lib.read(data.dir)


def make_train_dataset(config: config_lib.Config, manifest: dict, strategy):
    """The distributed, repeated training dataset and the number of steps in one epoch."""
    global_batch = config.data.batch_size
    num_examples = manifest["splits"][config.data.train_split]["num_examples"]
    steps_per_epoch = config.train.steps_per_epoch or max(1, num_examples // global_batch)

    def dataset_fn(input_context: tf.distribute.InputContext):
        return data_lib.load(
            config.data.dir, config.data.train_split,
            input_context.get_per_replica_batch_size(global_batch), training=True,
            input_context=input_context, shuffle_buffer=config.data.shuffle_buffer,
            cache=config.data.cache, repeat=True, seed=config.train.seed)

    return strategy.distribute_datasets_from_function(dataset_fn), steps_per_epoch


def make_optimizer(train_config: config_lib.TrainConfig):
    """The optimizer that `train.optimizer` names."""
    lr = train_config.learning_rate
    if train_config.optimizer == "sgd":
        return keras.optimizers.SGD(lr, momentum=train_config.momentum)
    if train_config.optimizer == "adamw":
        return keras.optimizers.AdamW(lr, weight_decay=train_config.weight_decay)
    return keras.optimizers.Adam(lr)


def make_callbacks(model_dir: str) -> list:
    """TensorBoard logs and the best checkpoint by validation accuracy."""
    return [
        keras.callbacks.TensorBoard(log_dir=join(model_dir, run_dir.LOGS)),
        keras.callbacks.ModelCheckpoint(
            join(model_dir, run_dir.CHECKPOINTS, "best"), monitor="val_accuracy", mode="max",
            save_best_only=True, save_weights_only=True),
    ]


def export(model, export_dir: str) -> None:
    """Saves a SavedModel under a temporary name, then moves it into place."""
    tmp = export_dir + ".tmp"
    remove(tmp)
    model.save(tmp, save_format="tf", include_optimizer=False)
    remove(export_dir)
    tf.io.gfile.rename(tmp, export_dir)
    logging.info("exported SavedModel to %s", export_dir)

"""`tftrain train`: config -> strategy -> data -> model -> fit -> evaluate -> export.

Read top to bottom, `run()` is the whole story of one run. Cross-cutting concerns live in
Keras callbacks (`tftrain/callbacks/`, one per file) and small modules: `optimizers`
(optimizers and schedules), `grad_accum`, `precision`, `data.reader`, `run_dir`.

A run is hard to kill: it backs up to `model_dir/backup/` every `train.backup_every_steps`
steps and at every epoch end, so the same command after a crash or SIGKILL resumes from the last
backup; SIGTERM backs up at the next step and exits with code 143 (`PREEMPTED_EXIT_CODE`).
"""
from __future__ import annotations

import dataclasses
import math
import sys

import tensorflow as tf
import tf_keras as keras
from absl import logging

from pipelines import load_pipeline
from tftrain import config as config_lib
from tftrain import distribute, grad_accum, models, optimizers, precision, run_dir
from tftrain import cluster, tpu
from tftrain.callbacks import backup as backup_lib
from tftrain.callbacks import preemption
from tftrain.callbacks.learning_rate import LearningRateLogger
from tftrain.callbacks.step_timer import StepTimer
from tftrain.callbacks.stop_at_step import StopAtStep
from tftrain.data import manifest as manifest_lib
from tftrain.data import reader
from tftrain.data.writer import write_dataset
from tftrain.fileio import join, remove, write_atomic

PREEMPTED_EXIT_CODE = preemption.PREEMPTED_EXIT_CODE


def train(config: config_lib.Config, model_dir: str, *, overwrite: bool = False) -> dict:
    """Trains, evaluates and exports one model; returns the summary written to summary.json.

    Raises `preemption.Preempted` (exit code 143) on SIGTERM, after backing up.
    """
    with preemption.SigtermHandler() as sigterm:
        return run(config, model_dir, overwrite, sigterm)


def run(config: config_lib.Config, model_dir: str, overwrite: bool,
        sigterm: preemption.SigtermHandler) -> dict:
    """The story of one run (see `train`)."""
    # 1. The strategy comes first: no TensorFlow op may run before it is built.
    if config.runtime.strategy == "dtensor":  # model parallelism: a DTensor mesh, no strategy
        from tftrain import dtensor_train

        return dtensor_train.run(config, model_dir, overwrite, sigterm)
    strategy = distribute.create_strategy(config.runtime)
    num_replicas = strategy.num_replicas_in_sync
    chief = cluster.is_chief(strategy)  # multi-worker: only the chief writes the run's files
    config_lib.check_divisible(config.data.batch_size, num_replicas)

    params_yaml = config_lib.to_yaml(config)
    if chief or not overwrite:
        run_dir.prepare(model_dir, overwrite, params_yaml)
    if chief:
        write_atomic(join(model_dir, run_dir.PARAMS), params_yaml)
    keras.utils.set_random_seed(config.train.seed)
    policy = precision.set_policy(config.runtime.mixed_precision, strategy)

    # 2. Data: converted the first time it is needed, then read from its TFRecord shards.
    #    One update consumes grad_accum_steps micro-batches of data.batch_size examples.
    manifest = ensure_dataset(config.data, chief)
    accum = config.train.grad_accum_steps
    plan = plan_steps(config.train, manifest["splits"][config.data.train_split]["num_examples"],
                      config.data.batch_size * accum)
    train_data = reader.load_distributed(
        strategy, config.data.dir, config.data.train_split, config.data.batch_size * accum,
        training=True, shuffle_buffer=config.data.shuffle_buffer, cache=config.data.cache,
        repeat=True, seed=config.train.seed,
        service_address=config.data.service_address, service_mode=config.data.service_mode)
    static_shapes = distribute.strategy_name(strategy) == "tpu"
    eval_data = reader.load_distributed(strategy, config.data.dir, config.data.eval_split,
                                        config.data.batch_size, training=False,
                                        drop_remainder=static_shapes)

    # 3. Model, built and compiled inside the strategy's scope. `trainer` is the model itself,
    #    or a wrapper that accumulates gradients; `model` is what gets exported.
    tpu.check_ready(config, strategy)  # TPU only: static shapes, batch split, bf16, ...
    input_shape = reader.load(config.data.dir, config.data.eval_split, 1,
                              training=False).element_spec[0].shape[1:]
    with strategy.scope():
        model = models.build_model(config.model.name, config.model.params, input_shape,
                                   manifest["info"]["num_classes"])
        trainer = grad_accum.wrap(model, accum)
        trainer.compile(
            optimizer=optimizers.make_optimizer(config.train, plan.steps_per_epoch, plan.total_steps),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"], steps_per_execution=config.train.steps_per_execution)

    # 4. Fit, resuming from model_dir/backup/ when an earlier attempt was interrupted.
    backup = backup_lib.Backup(join(model_dir, run_dir.BACKUP), config.train.backup_every_steps)
    timer = StepTimer(config.data.batch_size * accum)
    callbacks = make_callbacks(config.train, model_dir, plan, backup, timer, sigterm)
    history = trainer.fit(train_data, epochs=plan.epochs, steps_per_epoch=plan.steps_per_epoch,
                          validation_data=eval_data, callbacks=callbacks,
                          verbose=1 if sys.stdout.isatty() else 2)
    epochs_done = history.epoch[-1] + 1 if history.epoch else (backup.resumed_at or (0,))[0]
    validation = {k[4:]: float(v[-1]) for k, v in history.history.items() if k.startswith("val_")}
    if not validation:  # resumed after the last epoch: nothing was validated in this attempt
        validation = evaluate(trainer, eval_data)

    # 5. Evaluate on the test split, export, and summarize; the backup goes last.
    test_data = reader.load_distributed(strategy, config.data.dir, config.data.test_split,
                                        config.data.batch_size, training=False,
                                        drop_remainder=static_shapes)
    cluster.dump_weights(model)  # debug aid: only when TFTRAIN_DUMP_WEIGHTS_DIR is set
    # Every worker takes part in the save; non-chief workers into a temporary directory.
    export_dir = cluster.write_dir_for(join(model_dir, run_dir.EXPORT), strategy)
    export(model, export_dir)
    cluster.cleanup(export_dir, join(model_dir, run_dir.EXPORT))
    summary = {
        "model_dir": model_dir,
        "data_dir": config.data.dir,
        "epochs": epochs_done,
        "steps": int(trainer.optimizer.iterations.numpy()),
        "eval": {"split": config.data.test_split, **evaluate(trainer, test_data)},
        "validation": validation,
        "strategy": distribute.strategy_name(strategy),
        "num_replicas": num_replicas,
        "num_workers": cluster.num_workers(),
        "mixed_precision": policy,
        "grad_accum_steps": accum,
        "resumed_from": list(backup.resumed_at) if backup.resumed_at else None,
        "seconds_per_step": timer.seconds_per_step() if timer.epochs else None,
        "examples_per_second": timer.examples_per_second() if timer.epochs else None,
    }
    if chief:
        run_dir.finish(model_dir, summary)
    return summary


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How long the run is, in optimizer updates."""

    steps_per_epoch: int
    epochs: int
    total_steps: int


def plan_steps(train_config: config_lib.TrainConfig, num_examples: int,
               examples_per_step: int) -> StepPlan:
    """`train.epochs` of `steps_per_epoch` (default one pass), or `train.steps` when set.

    With `train.steps`, epochs are `steps_per_epoch` long (at most `train.steps`) and the last
    one ends at step `train.steps`; `train.epochs` is then not used.
    """
    steps_per_epoch = train_config.steps_per_epoch or max(1, num_examples // examples_per_step)
    if train_config.steps:
        steps_per_epoch = min(steps_per_epoch, train_config.steps)
        epochs = math.ceil(train_config.steps / steps_per_epoch)
        logging.info("train.steps=%d: %d epoch(s) of %d steps (train.epochs is not used)",
                     train_config.steps, epochs, steps_per_epoch)
        return StepPlan(steps_per_epoch, epochs, train_config.steps)
    return StepPlan(steps_per_epoch, train_config.epochs, train_config.epochs * steps_per_epoch)


def ensure_dataset(data: config_lib.DataConfig, chief: bool = True) -> dict:
    """Reads the dataset's manifest, converting the raw source first if there is none yet.

    Multi-worker: the chief converts; the other workers wait for its manifest.
    """
    if not chief and not manifest_lib.exists(data.dir):
        cluster.wait_for(join(data.dir, manifest_lib.MANIFEST_NAME), "the dataset",
                         cluster.DATASET_WAIT_SECONDS)
    if not manifest_lib.exists(data.dir):
        logging.info("no dataset in %s yet: converting with pipeline %r", data.dir, data.pipeline)
        write_dataset(load_pipeline(data.pipeline), data.source, data.dir)
    return manifest_lib.read(data.dir)


def make_callbacks(train_config: config_lib.TrainConfig, model_dir: str, plan: StepPlan,
                   backup, timer, sigterm) -> list:
    """The callbacks of `fit`, in the order they must run at each epoch end.

    The learning rate is added to the logs before TensorBoard writes them; the best checkpoint
    is written before the backup, so a backed-up epoch always has its checkpoint.
    """
    mode = "min" if train_config.monitor.endswith("loss") else "max"
    callbacks = [
        LearningRateLogger(),
        keras.callbacks.TensorBoard(log_dir=join(model_dir, run_dir.LOGS)),
        keras.callbacks.ModelCheckpoint(
            join(model_dir, run_dir.CHECKPOINTS, "best"), monitor=train_config.monitor, mode=mode,
            save_best_only=True, save_weights_only=True),
        timer,
    ]
    if train_config.early_stopping_patience:
        callbacks.append(keras.callbacks.EarlyStopping(
            monitor=train_config.monitor, mode=mode, patience=train_config.early_stopping_patience,
            verbose=1))
    plateau = optimizers.plateau_callback(train_config)
    if plateau:
        callbacks.append(plateau)
    if plan.total_steps < plan.epochs * plan.steps_per_epoch:
        callbacks.append(StopAtStep(plan.total_steps))
    return callbacks + [backup, preemption.PreemptionCallback(sigterm, backup)]


def evaluate(model: keras.Model, dataset) -> dict:
    """The compiled metrics of `model` on `dataset`, as floats."""
    return {k: float(v) for k, v in model.evaluate(dataset, return_dict=True, verbose=0).items()}


def export(model, export_dir: str) -> None:
    """Saves a SavedModel under a temporary name, then moves it into place."""
    if export_dir.startswith("ram://"):
        # TensorFlow's in-memory filesystem loses a directory's files when it is renamed.
        remove(export_dir)
        model.save(export_dir, save_format="tf", include_optimizer=False)
        return
    tmp = export_dir + ".tmp"
    remove(tmp)
    model.save(tmp, save_format="tf", include_optimizer=False)
    remove(export_dir)
    tf.io.gfile.rename(tmp, export_dir)
    logging.info("exported SavedModel to %s", export_dir)

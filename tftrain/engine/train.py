"""`tftrain train`: config -> backend -> data -> task and model -> fit -> evaluate -> export.

Read top to bottom, `run()` is the whole story of one run, the same for every backend: a
tf.distribute strategy or a DTensor mesh (`engine.backends`, the only place that knows which).
Cross-cutting concerns live in Keras callbacks (`tftrain/callbacks/`, one per file) and small
modules: `optimizers` (optimizers and schedules), `grad_accum`, `precision`, `data.reader`,
`run_dir`; the task (`tftrain.tasks`) decides the head, loss, metrics and what is monitored.

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
from tftrain import ownership, run_dir, tasks
from tftrain.engine import backends, hparams, optimizers
from tftrain.runtime import cluster, launch
from tftrain.callbacks import backup as backup_lib
from tftrain.callbacks import divergence, preemption, unfreeze
from tftrain.callbacks.callback_state import CallbackState
from tftrain.callbacks.divergence import DivergenceGuard
from tftrain.callbacks.curves import Curves
from tftrain.callbacks.heartbeat import Heartbeat
from tftrain.callbacks.learning_rate import LearningRateLogger
from tftrain.callbacks.step_timer import StepTimer
from tftrain.callbacks.stop_at_step import StopAtStep
from tftrain.data import manifest as manifest_lib
from tftrain.data import foreign, writer
from tftrain.errors import DataError
from tftrain.engine.export import export
from tftrain.fileio import join, write_atomic

PREEMPTED_EXIT_CODE = preemption.PREEMPTED_EXIT_CODE


def train(config: config_lib.Config, model_dir: str, *, overwrite: bool = False,
          convert_data: bool = True) -> dict:
    """Trains, evaluates and exports one model; returns the summary written to summary.json.

    `convert_data=False` forbids converting the config's embedded data into a missing dataset
    (see `ensure_dataset`). Raises `preemption.Preempted` (exit code 143) on SIGTERM, after
    backing up.
    """
    with preemption.SigtermHandler() as sigterm:
        try:
            return run(config, model_dir, overwrite, sigterm, convert_data)
        finally:  # a run that ended in an error must not keep its directory locked in-process
            run_dir.release(model_dir)


def run(config: config_lib.Config, model_dir: str, overwrite: bool,
        sigterm: preemption.SigtermHandler, convert_data: bool = True) -> dict:
    """The story of one run (see `train`)."""
    # 1. The backend comes first (a tf.distribute strategy or a DTensor mesh): no TensorFlow op
    #    may run before it is built. A TPU run that would fail stops before it connects to (and
    #    pays for) the TPU (tpu.check_ready checks the rest after connecting).
    from tftrain import check

    check.before_connecting(config, model_dir, convert_data)  # no-op for other strategies
    backend = backends.create(config)
    chief = backend.chief  # multi-worker: only the chief writes the run's files

    # The task (and train.monitor=auto) follows the dataset's labels unless task.type says.
    config, task = resolve_task(config)  # None while the dataset is still to be converted
    params_yaml = config_lib.to_yaml(config)
    if chief or not overwrite:
        run_dir.prepare(model_dir, overwrite, params_yaml, chief=chief)  # the chief locks it
    if chief:
        write_atomic(join(model_dir, run_dir.PARAMS), params_yaml)
    policy = backend.set_up(config)  # seeds, determinism, precision: before any model

    # 2. Data: converted the first time it is needed, then read from its TFRecord shards.
    #    One update consumes grad_accum_steps micro-batches of data.batch_size examples.
    manifest = ensure_dataset(config.data, chief, convert_data)
    if task is None:  # converted just now, or TFRecords of other tools: params.yaml says it
        config, task = tasks.resolve(config, manifest)
        if chief:
            write_atomic(join(model_dir, run_dir.PARAMS), config_lib.to_yaml(config))
    accum = config.train.grad_accum_steps
    plan = plan_steps(config.train, manifest["splits"][config.data.train_split]["num_examples"],
                      config.data.batch_size * accum)
    # A resumed run reads on from the batches the backed-up steps consumed.
    train_data = backend.training_data(
        config, backup_lib.steps_done(join(model_dir, run_dir.BACKUP), plan.steps_per_epoch))
    eval_data = backend.evaluation_data(config, config.data.eval_split, for_fit=True)

    # 3. Model, built and compiled by the backend (inside the strategy's scope). `trainer` is
    #    what `fit` trains (the model, a gradient-accumulating wrapper, or DTensor's sharded
    #    twin); `model` is what gets exported.
    model, trainer = backend.build(config, manifest, plan)

    # 4. Fit, resuming from model_dir/backup/ when an earlier attempt was interrupted.
    backup = backup_lib.Backup(join(model_dir, run_dir.BACKUP), config.train.backup_every_steps)
    if backend.random_state is not None:  # train.deterministic: resumed with the backup
        backup.trackables["random_state"] = backend.random_state
    timer = StepTimer(config.data.batch_size * accum)
    callbacks = make_callbacks(config.train, model_dir, plan, backup, timer, sigterm, chief=chief,
                               task=task, requested=unfreeze.requested_by(model))
    history = trainer.fit(train_data, epochs=plan.epochs, steps_per_epoch=plan.steps_per_epoch,
                          validation_data=eval_data,
                          validation_steps=backend.validation_steps(config, manifest),
                          callbacks=callbacks, verbose=1 if sys.stdout.isatty() else 2)
    epochs_done = history.epoch[-1] + 1 if history.epoch else (backup.resumed_at or (0,))[0]
    steps_done = int(trainer.optimizer.iterations.numpy())
    trained = backend.trained_model(model, trainer, task)  # DTensor: gathered into `model`
    validation = {k[4:]: float(v[-1]) for k, v in history.history.items() if k.startswith("val_")}
    if not validation:  # resumed after the last epoch: nothing was validated in this attempt
        validation = evaluate(trained, backend.evaluation_data(config, config.data.eval_split))

    # 5. Evaluate on the test split, export, and summarize; the backup goes last. Evaluation
    #    comes before the export: a DTensor-gathered model evaluated after it was exported
    #    reports chance accuracy with the right loss (seen on TF 2.21).
    test_metrics = evaluate(trained, backend.evaluation_data(config, config.data.test_split))
    cluster.dump_weights(model)  # debug aid: only when TFTRAIN_DUMP_WEIGHTS_DIR is set
    # Every worker takes part in the save; non-chief workers into a temporary directory.
    export_dir = backend.export_dir(join(model_dir, run_dir.EXPORT))
    export(model, export_dir, config.data, manifest)
    cluster.cleanup(export_dir, join(model_dir, run_dir.EXPORT))
    summary = {
        "model_dir": model_dir,
        "data_dir": config.data.dir,
        "task": task.resolved(),
        "epochs": epochs_done,
        "steps": steps_done,
        "eval": {"split": config.data.test_split, **test_metrics},
        "validation": validation,
        "mixed_precision": policy,
        "grad_accum_steps": accum,
        "resumed_from": list(backup.resumed_at) if backup.resumed_at else None,
        **launch.restart_summary(),  # restarts by `tftrain launch --max_restarts`
        "seconds_per_step": timer.seconds_per_step() if timer.timed else None,
        "examples_per_second": timer.examples_per_second() if timer.timed else None,
        "rollbacks": divergence.rollbacks_of(callbacks),  # by the guard, train.on_nan=rollback
        **backend.summary(trainer),  # strategy, replicas, workers, XLA; DTensor's mesh
    }
    if chief:
        write_hparams(model_dir, config, summary)
        run_dir.finish(model_dir, summary)
    return summary


def write_hparams(model_dir: str, config: config_lib.Config, summary: dict) -> None:
    """The run's row in TensorBoard's HParams table (see `tftrain.engine.hparams`)."""
    test = {k: v for k, v in summary["eval"].items() if isinstance(v, float)}
    hparams.write(join(model_dir, run_dir.LOGS), config, test, summary["validation"],
                  summary["steps"], trial_id=model_dir)


def resolve_task(config: config_lib.Config):
    """`(config, task)` with `task.type`, `task.loss` and `train.monitor` resolved from the
    dataset's manifest (see `tftrain.tasks.resolve`); `(config, None)` when there is no tftrain
    dataset in `data.dir` yet (or it holds other tools' TFRecords): resolve after converting."""
    if config.data.format == "tfrecord" or not manifest_lib.exists(config.data.dir):
        return config, None
    return tasks.resolve(config, manifest_lib.read(config.data.dir))


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


def ensure_dataset(data: config_lib.DataConfig, chief: bool = True, convert: bool = True) -> dict:
    """The dataset's manifest; converts `data.source` with `data.pipeline` first if needed.

    The conversion happens only into a `data.dir` that is absent, empty or holds tftrain's own
    interrupted conversion, and only when `convert` (the CLI says no when the command line
    moved `data.dir` away from a config whose pipeline needs no source: the embedded digits
    would otherwise be trained on in place of the data the user pointed at). Anything else is
    refused with a message naming the key to set. `data.format=tfrecord` reads TFRecords other
    tools wrote, as they are. Multi-worker: the chief converts; the others wait for its manifest.
    """
    if data.format == "tfrecord":
        return foreign.read_manifest(data)
    if not chief and not manifest_lib.exists(data.dir):
        cluster.wait_for(join(data.dir, manifest_lib.MANIFEST_NAME), "the dataset",
                         cluster.DATASET_WAIT_SECONDS)
    if not manifest_lib.exists(data.dir):
        check_convertible(data, convert)
        logging.info("no dataset in %s yet: converting %s with pipeline %r", data.dir,
                     repr(data.source) if data.source else "its embedded data", data.pipeline)
        writer.write_dataset(load_pipeline(data.pipeline, **data.pipeline_options), data.source, data.dir)
    return manifest_lib.read(data.dir)


def check_convertible(data: config_lib.DataConfig, convert: bool) -> None:
    """Raises DataError unless tftrain may convert into `data.dir` (see `ensure_dataset`)."""
    foreign_files = (ownership.dataset_contents(data.dir).foreign
                     if tf.io.gfile.isdir(data.dir) else ())
    if foreign_files:
        shown = ", ".join(sorted(foreign_files)[:3]) + (", ..." if len(foreign_files) > 3 else "")
        records = [name for name in foreign_files if ".tfrecord" in name or "-of-" in name]
        how = ("to train on these TFRecords, set data.format=tfrecord and data.pipeline=NAME "
               "(the pipeline whose schema they follow) with data.info={num_classes: K}"
               if records else "point data.dir at a tftrain dataset, or at a new or empty "
               "directory to convert data.source into")
        raise DataError(f"data.dir={data.dir} holds no tftrain dataset (no "
                        f"{manifest_lib.MANIFEST_NAME}) but {len(foreign_files)} file(s) tftrain "
                        f"did not write ({shown}); tftrain will not convert into it: {how}.")
    if not convert:
        raise DataError(
            f"data.dir={data.dir} holds no tftrain dataset (no {manifest_lib.MANIFEST_NAME}), and "
            f"it was set on the command line while the config's pipeline {data.pipeline!r} "
            "converts its embedded data: tftrain does not train on that in place of yours. "
            "Convert your data first (tftrain convert --output=...), or name it: "
            "data.pipeline=NAME,data.source=PATH (converted on first use); add "
            f"data.pipeline={data.pipeline} to put the {data.pipeline!r} data there.")


def make_callbacks(train_config: config_lib.TrainConfig, model_dir: str, plan: StepPlan,
                   backup, timer, sigterm, chief: bool = True, task=None,
                   requested: list = ()) -> list:
    """The callbacks of `fit`, in the order they must run at each epoch end.

    The learning rate is added to the logs before TensorBoard writes them; the best checkpoint
    is written before the backup, so a backed-up epoch always has its checkpoint. `task` says
    which way `train.monitor` improves (default: a classifier's metrics). The state of the
    stateful ones (early stopping, plateau, best value, timer, divergence guard) is saved with
    each backup and restored on resume (`callbacks.callback_state`).
    """
    mode = (task or tasks.TASKS["classification"]).mode(train_config.monitor)
    callbacks = [
        LearningRateLogger(),
        Curves(model_dir, chief=chief),  # curves.png, with the learning rate: after the logger
        keras.callbacks.TensorBoard(log_dir=join(model_dir, run_dir.LOGS),
                                    profile_batch=config_lib.profile_steps(
                                        train_config.profile_steps) or 0),
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
        plateau.mode = mode  # its `auto` mode knows only "acc" names as higher-is-better (r2)
        plateau._reset()  # applies the mode, as its constructor does
        callbacks.append(plateau)
    if plan.total_steps < plan.epochs * plan.steps_per_epoch:
        callbacks.append(StopAtStep(plan.total_steps))
    heartbeat = Heartbeat.from_env()  # only under `tftrain launch --hang_timeout`
    if heartbeat:
        callbacks.append(heartbeat)
    # First: a NaN/Inf loss is acted on before any other callback sees the step.
    guard = DivergenceGuard(train_config.on_nan, backup, train_config.rollback_lr_factor,
                            train_config.max_rollbacks)
    # The model's own (`callbacks.unfreeze`) come next: before the backup, which builds nothing.
    callbacks = [guard, *requested, *callbacks, backup,
                 preemption.PreemptionCallback(sigterm, backup)]
    backup.state = CallbackState(callbacks)  # their counters go into each backup
    return callbacks


def evaluate(model: keras.Model, dataset) -> dict:
    """The compiled metrics of `model` on `dataset`, as floats."""
    return {k: float(v) for k, v in model.evaluate(dataset, return_dict=True, verbose=0).items()}

"""`tftrain train`: config -> backend -> data -> task and model -> fit -> evaluate -> export.

Read top to bottom, `run()` is the whole story of one run, the same for every backend: a
tf.distribute strategy, a DTensor mesh or pipeline stages (`engine.backends`,
`engine.pipeline_backend`; `engine.backend_choice` is the only place that knows which).
Cross-cutting concerns live in Keras callbacks (`tftrain/callbacks/`, one per file) and small
modules: `optimizers` (optimizers and schedules), `grad_accum`, `precision`, `data.reader`,
`run_dir`; the task (`tftrain.tasks`) decides the head, loss, metrics and what is monitored.

A run is hard to kill: it backs up to `model_dir/backup/` every `train.backup_every_steps`
steps and at every epoch end, so the same command after a crash or SIGKILL resumes from the last
backup; SIGTERM backs up at the next step and exits with code 143 (`PREEMPTED_EXIT_CODE`).
"""
from __future__ import annotations

import dataclasses
import sys

import tensorflow as tf
import tf_keras as keras

from tftrain import config as config_lib
from tftrain import rules, run_dir, tasks
from tftrain.engine import backend_choice, hparams, per_class, run_memory
from tftrain.engine.utilization import Utilization
from tftrain.engine.prepare import prepare
from tftrain.data import passes
from tftrain.training import ema, gradients, optimizers
from tftrain.training.steps import StepPlan
from tftrain.runtime import cluster, launch
from tftrain.callbacks import backup as backup_lib
from tftrain.callbacks import divergence, preemption, unfreeze
from tftrain.callbacks.callback_state import CallbackState
from tftrain.callbacks.divergence import DivergenceGuard
from tftrain.callbacks.gradient_norm import GradientNormLog
from tftrain.callbacks.ema import EvaluateAverage
from tftrain.callbacks.curves import Curves
from tftrain.callbacks.heartbeat import Heartbeat
from tftrain.callbacks.learning_rate import LearningRateLogger
from tftrain.callbacks.progress_log import ProgressLog
from tftrain.callbacks.step_timer import StepTimer
from tftrain.callbacks.stop_at_step import StopAtStep
from tftrain.engine.export import export
from tftrain.errors import ConfigError
from tftrain.fileio import is_local, join, write_atomic

PREEMPTED_EXIT_CODE = preemption.PREEMPTED_EXIT_CODE


def train(config: config_lib.Config, model_dir: str, *, overwrite: bool = False,
          convert_data: bool = True) -> dict:
    """Trains, evaluates and exports one model; returns the summary written to summary.json.

    `convert_data=False` forbids converting the config's embedded data into a missing dataset
    (see `ensure_dataset`). Raises `preemption.Preempted` (exit code 143) on SIGTERM, after
    backing up.
    """
    # A local directory is checked before the slow steps and claimed once the config is valid;
    # a bucket's (gs://) is checked when claimed: reaching it must not come before a TPU's
    # checks, and an object store leaves no empty directory behind.
    chief, local = cluster.is_chief(), is_local(model_dir)
    if local and (chief or not overwrite):
        run_dir.check(model_dir, overwrite)
    created = chief and local and not tf.io.gfile.exists(model_dir)
    with preemption.SigtermHandler() as sigterm:
        try:
            return run(config, model_dir, overwrite, sigterm, convert_data)
        except BaseException:
            run_dir.release(model_dir)
            if created:  # a run that wrote nothing leaves no directory behind
                run_dir.discard_unused(model_dir)
            raise
        finally:  # a run that ended in an error must not keep its directory locked in-process
            run_dir.release(model_dir)


def run(config: config_lib.Config, model_dir: str, overwrite: bool,
        sigterm: preemption.SigtermHandler, convert_data: bool = True) -> dict:
    """The story of one run (see `train`)."""
    # 1. The backend comes first (a tf.distribute strategy or a DTensor mesh): no TensorFlow op
    #    may run before it is built. A TPU run that would fail stops before it connects to (and
    #    pays for) the TPU (tpu.check_ready checks the rest after connecting).
    rules.before_connecting(config, model_dir, convert_data)  # no-op for other strategies
    backend = backend_choice.create(config)

    # 2-3. The run, built as `doctor` and `check` build it: the task (from the dataset's
    #    labels unless task.type says), seeds and precision, the dataset (converted the first
    #    time it is needed), the step plan, and the model compiled inside the backend.
    #    params.yaml records the resolved config; the chief locks the run directory. A resumed
    #    run keeps the plan it started with (its dataset may have grown since).
    backup_dir = join(model_dir, run_dir.BACKUP)
    shards = passes.recorded(backup_dir) if backup_lib.backed_up(backup_dir) else None
    run_ = prepare(config, backend, convert_data=convert_data,
                   on_config=RunDirectory(model_dir, overwrite, backend.chief).record,
                   train_examples=shards.examples if shards else None)
    config, plan, model, trainer = run_.config, run_.plan, run_.model, run_.trainer

    # 4. Fit, resuming from model_dir/backup/ after an interrupted attempt: reading on from the
    #    batches the backed-up steps consumed, on the shards it had until its pass ends (new
    #    shards, appended since, from the next: `data.passes`).
    backup = make_backup(config.train, backend, backup_dir)
    start_step = backup_lib.steps_done(backup_dir, plan.steps_per_epoch)
    train_data = backend.training_data(config, start_step, shard_sets=passes.for_run(
        backup_dir, shards, config.data, run_.manifest, start_step, backend.chief))
    timer = StepTimer(run_.examples_per_step)
    usage = Utilization.of(model, backend, run_.policy)  # model FLOPs and the devices' peak
    callbacks = make_callbacks(config.train, model_dir, plan, backup, timer, sigterm,
                               chief=backend.chief, task=run_.task, writes=backend.backs_up,
                               requested=unfreeze.requested_by(model), utilization=usage)
    validation_data = backend.evaluation_data(config, config.data.eval_split, for_fit=True)
    try:
        history = trainer.fit(train_data, epochs=plan.epochs, steps_per_epoch=plan.steps_per_epoch,
                              validation_data=validation_data, callbacks=callbacks,
                              validation_steps=validation_steps(run_),
                              verbose=1 if sys.stdout.isatty() else 2)
    finally:  # a failed run still leaves its last backup whole
        backup.wait()
    trained, averaging = evaluated_model(model, trainer, run_)  # train.ema_decay: the average
    validation = last_validation(history, trained, run_)

    # 5. Evaluate on the test split, export (MultiWorkerMirrored: every worker, the others into
    #    temporary directories), summarize; the backup goes last. Evaluation comes before the
    #    export: a DTensor-gathered model evaluated after it was exported reports chance accuracy.
    test_metrics = evaluate_test_split(trained, model, run_, model_dir)
    # debug aid (only when TFTRAIN_DUMP_WEIGHTS_DIR is set): with the average, the training
    # weights follow (the optimizer holds them now)
    cluster.dump_weights(model, ema.averages(averaging) if averaging else ())
    export_dir = backend.export_dir(join(model_dir, run_dir.EXPORT))  # None: no part in it
    if export_dir:
        export(model, export_dir, config.data, run_.manifest)
        cluster.cleanup(export_dir, join(model_dir, run_dir.EXPORT))
    rate = timer.examples_per_second() if timer.timed else None
    summary = RunSummary(
        model_dir=model_dir, data_dir=config.data.dir, task=run_.task.resolved(),
        parameters=int(model.count_params()),
        memory=run_memory.measure(trainer, trainer.optimizer),  # per device, measured
        epochs=history.epoch[-1] + 1 if history.epoch else (backup.resumed_at or (0,))[0],
        steps=int(trainer.optimizer.iterations.numpy()),
        eval={"split": config.data.test_split, **test_metrics}, validation=validation,
        ema={"decay": config.train.ema_decay, "evaluated": True} if averaging else None,
        evaluation=bounds_of(config.train), mixed_precision=run_.policy,
        grad_accum_steps=config.train.grad_accum_steps,
        gradients=gradients.summary(trainer.optimizer),  # global norms, clipped updates
        resumed_from=list(backup.resumed_at) if backup.resumed_at else None,
        seconds_per_step=timer.seconds_per_step() if timer.timed else None,
        examples_per_second=rate, utilization=usage.confirmed(rate).summary(rate),
        rollbacks=divergence.rollbacks_of(callbacks),  # by the guard, train.on_nan=rollback
        restarts=launch.restart_summary(),  # restarts by `tftrain launch --max_restarts`
        backup=backup.stats.summary(),  # count, blocked and writing seconds, bytes
        backend=backend.summary(trainer),  # strategy, replicas, workers, XLA; DTensor's mesh
    ).to_json()
    if backend.chief:
        write_hparams(model_dir, config, summary)
        run_dir.finish(model_dir, summary)
    return summary


# Backends whose backups may be written in the background: one process, every variable local.
# A multi-worker run's non-chief workers write into a temporary directory removed right after
# the save (a background write would race it); TPU and DTensor variables are untested here.
ASYNC_BACKUP_BACKENDS = ("one_device", "mirrored", "pipeline")


def make_backup(train_config: config_lib.TrainConfig, backend,
                backup_dir: str) -> backup_lib.Backup:
    """The run's `Backup` callback: its cadence, whether it writes in the background, and
    (train.deterministic) the random layers' generators, saved and resumed with it."""
    backup = backup_lib.Backup(backup_dir, train_config.backup_every_steps,
                               write_async=backs_up_in_background(train_config, backend),
                               writes=backend.backs_up)
    if backend.random_state is not None:
        backup.trackables["random_state"] = backend.random_state
    return backup


def backs_up_in_background(train_config: config_lib.TrainConfig, backend) -> bool:
    """Whether `train.async_backup` writes this run's backups in the background; raises
    ConfigError for `true` on a backend that cannot."""
    safe = backend.name in ASYNC_BACKUP_BACKENDS and backend.num_workers == 1
    if train_config.async_backup == "true" and not safe:
        raise ConfigError(
            f"train.async_backup=true: a {backend.name} run with {backend.num_workers} "
            f"worker(s) writes its backups synchronously (background writes are for "
            f"{', '.join(ASYNC_BACKUP_BACKENDS)} runs in one process): use auto or false")
    return safe and train_config.async_backup != "false"


def bounds_of(train_config: config_lib.TrainConfig) -> dict:
    """How much evaluation the run did, as summary.json records it."""
    return {key: getattr(train_config, key)
            for key in ("validation_steps", "validation_every_steps", "test_steps")}


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What `summary.json` says of a finished run (`to_json`: its keys, in this order, with
    the backend's and the launch's own keys merged in)."""

    model_dir: str
    data_dir: str
    task: dict
    parameters: int  # the exported model's weights, trainable or not
    memory: dict  # weights_bytes_per_device, optimizer_bytes_per_device (`engine.run_memory`)
    epochs: int
    steps: int
    eval: dict  # the test split's metrics, with its name under "split"
    validation: dict
    ema: dict | None  # train.ema_decay: decay, evaluated (eval and validation: the average)
    evaluation: dict  # validation_steps, validation_every_steps, test_steps (0: whole, epochs)
    mixed_precision: str
    grad_accum_steps: int
    gradients: dict  # clip_global_norm, last_norm, max_norm, clipped_steps, clipped_fraction
    resumed_from: list | None
    seconds_per_step: float | None
    examples_per_second: float | None
    utilization: dict  # model_flops_per_example, achieved/peak FLOP/s, mfu (engine.utilization)
    rollbacks: int
    restarts: dict  # `restarts` and `restart_causes` (runtime.launch)
    backup: dict  # async, count, blocked_seconds, write_seconds, bytes (callbacks.backup)
    backend: dict  # strategy, num_replicas, num_workers, jit_compile (+ DTensor's mesh)

    def to_json(self) -> dict:
        """The JSON object of summary.json."""
        fields = dataclasses.asdict(self)
        restarts, backend = fields.pop("restarts"), fields.pop("backend")
        rollbacks = fields.pop("rollbacks")
        timing = {k: fields.pop(k) for k in ("seconds_per_step", "examples_per_second")}
        utilization = fields.pop("utilization")
        return {**fields, **restarts, **timing, **utilization, "rollbacks": rollbacks,
                **backend}


class RunDirectory:
    """The run directory's side of `prepare`: `record(config)`, called once the config is
    valid, claims it (the chief creates and locks it; a run that is not the chief's only checks
    it) and writes the resolved config to params.yaml, from the chief only."""

    def __init__(self, model_dir: str, overwrite: bool, chief: bool):
        self.model_dir, self.overwrite, self.chief = model_dir, overwrite, chief

    def record(self, config: config_lib.Config) -> None:
        """Claims the directory; writes params.yaml (chief)."""
        params_yaml = config_lib.to_yaml(config)
        if self.chief or not self.overwrite:
            run_dir.prepare(self.model_dir, self.overwrite, params_yaml, chief=self.chief)
        if self.chief:
            write_atomic(join(self.model_dir, run_dir.PARAMS), params_yaml)


def write_hparams(model_dir: str, config: config_lib.Config, summary: dict) -> None:
    """The run's row in TensorBoard's HParams table (see `tftrain.engine.hparams`)."""
    test = {k: v for k, v in summary["eval"].items() if isinstance(v, float)}
    hparams.write(join(model_dir, run_dir.LOGS), config, test, summary["validation"],
                  summary["steps"], trial_id=model_dir)


def make_callbacks(train_config: config_lib.TrainConfig, model_dir: str, plan: StepPlan,
                   backup, timer, sigterm, chief: bool = True, task=None, writes: bool = True,
                   requested: list = (), utilization=None) -> list:
    """The callbacks of `fit`, in the order they must run at each epoch end.

    The learning rate is added to the logs before TensorBoard writes them; the best checkpoint
    is written before the backup, so a backed-up epoch always has its checkpoint. `task` says
    which way `train.monitor` improves (default: a classifier's metrics). The state of the
    stateful ones (early stopping, plateau, best value, timer, divergence guard) is saved with
    each backup and restored on resume (`callbacks.callback_state`). `writes` False (a worker
    whose saves would only repeat the chief's): no TensorBoard logs and no best checkpoint.
    With `train.ema_decay`, validation and the best checkpoint see the weights' average
    (`callbacks.ema`), swapped back before the backup.
    """
    mode = (task or tasks.TASKS["classification"]).mode(train_config.monitor)
    best = [keras.callbacks.ModelCheckpoint(
        join(model_dir, run_dir.CHECKPOINTS, "best"), monitor=train_config.monitor, mode=mode,
        save_best_only=True, save_weights_only=True)] if writes else []
    if train_config.ema_decay:  # validated on the average, which the best checkpoint holds
        averaged = EvaluateAverage()
        best = [averaged, *best, averaged.after]
    callbacks = [
        LearningRateLogger(),
        Curves(model_dir, chief=chief),  # curves.png, with the learning rate: after the logger
        *([keras.callbacks.TensorBoard(log_dir=join(model_dir, run_dir.LOGS),
                                       profile_batch=config_lib.profile_steps(
                                           train_config.profile_steps) or 0)] if writes else []),
        *best,
        timer,
        ProgressLog(plan.total_steps, timer.examples_per_step, train_config.log_every_steps,
                    steps_per_execution=train_config.steps_per_execution,
                    log_dir=join(model_dir, run_dir.LOGS, "train") if chief else None,
                    lines=chief and not sys.stdout.isatty(), utilization=utilization),
    ]
    if train_config.early_stopping_patience:
        callbacks.append(keras.callbacks.EarlyStopping(
            monitor=train_config.monitor, mode=mode, patience=train_config.early_stopping_patience,
            verbose=1))
    plateau = optimizers.plateau_callback(train_config, mode)
    if plateau:
        callbacks.append(plateau)
    if plan.total_steps < plan.epochs * plan.steps_per_epoch:
        callbacks.append(StopAtStep(plan.total_steps))
    heartbeat = Heartbeat.from_env()  # only under `tftrain launch --hang_timeout`
    if heartbeat:
        callbacks.append(heartbeat)
    # First: the step's gradient norm into its logs, then a NaN/Inf loss or norm is acted on
    # before any other callback sees the step.
    norm = GradientNormLog(join(model_dir, run_dir.LOGS, "train") if writes and chief else None,
                           train_config.steps_per_execution)
    guard = DivergenceGuard(train_config.on_nan, backup, train_config.rollback_lr_factor,
                            train_config.max_rollbacks)
    # The model's own (`callbacks.unfreeze`) come next: before the backup, which builds nothing.
    callbacks = [norm, guard, *requested, *callbacks, backup,
                 preemption.PreemptionCallback(sigterm, backup)]
    backup.state = CallbackState(callbacks)  # their counters go into each backup
    return callbacks


def evaluated_model(model: keras.Model, trainer: keras.Model, run_) -> tuple:
    """`(the compiled model to evaluate and export after fit, the optimizer whose average of
    the weights it now holds)`: with `train.ema_decay` the average is swapped in (the optimizer
    keeps the training weights), else that optimizer is None. DTensor and pipeline stages:
    gathered into `model`."""
    averaging = ema.optimizer_of(trainer)
    if averaging:
        ema.swap(averaging)
    return run_.backend.trained_model(model, trainer, run_.task), averaging


def last_validation(history, trained: keras.Model, run_) -> dict:
    """The last validation's metrics; measured now when this attempt validated nothing (it
    resumed after the last epoch)."""
    validation = {k[4:]: float(v[-1]) for k, v in history.history.items() if k.startswith("val_")}
    if validation:
        return validation
    config = run_.config
    return evaluate(trained, run_.backend.evaluation_data(config, config.data.eval_split),
                    evaluation_steps(run_, config.data.eval_split, config.train.validation_steps))


def validation_steps(run_) -> int | None:
    """`fit`'s `validation_steps`: the backend's (None: the whole split), or the count that
    `evaluation_steps` gives other tools' TFRecords."""
    config = run_.config
    return (run_.backend.validation_steps(config, run_.dataset)
            or evaluation_steps(run_, config.data.eval_split) or None)


def evaluation_steps(run_, split: str, bound: int = 0) -> int:
    """The batches of an evaluation of `split`: `bound` (0: the whole split). Keras evaluates
    with `steps_per_execution` > 1 only a dataset of known size, and the reader cannot know
    the size of other tools' TFRecords (no manifest): for those, the whole split is the count
    the run made when it started, in global batches (full ones only on a TPU)."""
    config = run_.config
    if bound or config.data.format != "tfrecord" or config.train.steps_per_execution == 1:
        return bound
    examples, batch = run_.dataset.examples(split), config.data.batch_size
    return max(1, examples // batch if run_.backend.name == "tpu" else -(-examples // batch))


def evaluate_test_split(trained: keras.Model, model: keras.Model, run_, model_dir: str) -> dict:
    """The test split's metrics of the `trained` model (`train.test_steps` batches; a
    classifier's per-class measures too, `engine.per_class`, of `model`)."""
    config, backend = run_.config, run_.backend
    metrics = evaluate(trained, backend.evaluation_data(config, config.data.test_split),
                       evaluation_steps(run_, config.data.test_split, config.train.test_steps))
    metrics.update(per_class.measure(model, run_.task, config, model_dir, backend.chief))
    return metrics


def evaluate(model: keras.Model, dataset, steps: int = 0) -> dict:
    """The compiled metrics of `model` on `dataset` (its first `steps` batches; 0: all of it),
    as floats."""
    metrics = model.evaluate(dataset, steps=steps or None, return_dict=True, verbose=0)
    return {k: float(v) for k, v in metrics.items()}

"""What a run is made of, built once: `prepare` is steps 2-5 of the story, for every command.

`tftrain train` trains what `prepare` returns; `tftrain doctor` times it; `tftrain check` builds
it on this machine's CPU under the target's policy. None of them builds a run its own way, so
what one of them says about a config holds for the others, on every backend.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import tensorflow as tf
from absl import logging

from pipelines import load_pipeline
from tftrain import config as config_lib
from tftrain import ownership, tasks
from tftrain.data import foreign, writer
from tftrain.data import manifest as manifest_lib
from tftrain.engine.backends import Backend
from tftrain.errors import DataError
from tftrain.fileio import join
from tftrain.runtime import cluster
from tftrain.training.steps import StepPlan, plan_steps


@dataclasses.dataclass
class Run:
    """A run, built: its resolved config, backend, dataset, plan, task and compiled model."""

    config: config_lib.Config
    backend: Backend
    manifest: dict
    plan: StepPlan
    task: tasks.Task
    model: object  # keras.Model: what gets exported
    trainer: object  # keras.Model: what `fit` trains (the model, a wrapper, a sharded twin)
    policy: str  # the precision policy's name

    @property
    def dataset(self) -> manifest_lib.Manifest:
        """The manifest, typed."""
        return manifest_lib.typed(self.manifest)

    @property
    def examples_per_step(self) -> int:
        """Examples one optimizer update consumes: the global batch x `grad_accum_steps`."""
        return self.config.data.batch_size * self.config.train.grad_accum_steps


def prepare(config: config_lib.Config, backend: Backend, *, convert_data: bool = True,
            on_config: Callable[[config_lib.Config], None] = lambda config: None,
            train_examples: int | None = None) -> Run:
    """Resolves the task, sets up the backend, finds (or converts) the dataset, plans the
    steps, and builds and compiles the model inside the backend.

    `backend` comes first (`backend_choice.create`: no TensorFlow op may run before it). `on_config`
    receives the resolved config once everything it describes was built from it (`train` then
    claims the run directory and writes params.yaml: a refused config leaves none behind).
    `convert_data=False` forbids
    converting the config's embedded data into a missing dataset (see `ensure_dataset`).
    `train_examples` plans the steps over that many training examples instead of the split's
    (a resumed run keeps the plan it started with when its dataset has grown since).
    """
    config, task = resolve_task(config)  # None while the dataset is still to be converted
    policy = backend.set_up(config)  # seeds, determinism, precision: before any model
    manifest = ensure_dataset(config.data, backend.chief, convert_data)
    if task is None:  # converted just now, or TFRecords of other tools
        config, task = tasks.resolve(config, manifest)
    plan = plan_for(config, manifest, train_examples)
    model, trainer = backend.build(config, manifest, plan)
    on_config(config)  # valid, and its model built: only now is a run directory created
    return Run(config, backend, manifest, plan, task, model, trainer, policy)


def plan_for(config: config_lib.Config, manifest: dict, examples: int | None = None) -> StepPlan:
    """The run's step plan over its training split (or `examples` of it); a split smaller than
    one step is an error (the training input drops partial batches: it would be empty)."""
    examples = examples or manifest_lib.typed(manifest).examples(config.data.train_split)
    per_step = config.data.batch_size * config.train.grad_accum_steps
    if examples < per_step:
        raise DataError(f"split {config.data.train_split!r} of {config.data.dir} has {examples} "
                        f"examples, fewer than one step's {per_step} (data.batch_size x "
                        "train.grad_accum_steps): lower data.batch_size")
    return plan_steps(config.train, examples, per_step)


def resolve_task(config: config_lib.Config):
    """`(config, task)` with `task.type`, `task.loss` and `train.monitor` resolved from the
    dataset's manifest (see `tftrain.tasks.resolve`); `(config, None)` when there is no tftrain
    dataset in `data.dir` yet (or it holds other tools' TFRecords): resolve after converting."""
    if config.data.format == "tfrecord" or not manifest_lib.exists(config.data.dir):
        return config, None
    return tasks.resolve(config, manifest_lib.read(config.data.dir))


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

"""A trained run, read back: its resolved config (params.yaml) and how it reads its data.

Every command that works on a run (`prune`, `quantize`, `evaluate` of a run's model without
`--data`, `report`, and `predict`) reads the run's data through `RunData`: the whole `data`
section the run trained with (its directory, format, pipeline, pipeline options and info, so
TFRecords of other tools are read as training read them) and its test split unless told
otherwise. No command rebuilds that from a few keys of its own.
"""
from __future__ import annotations

import dataclasses
import os

import tensorflow as tf

from tftrain import config as config_lib
from tftrain import data as data_lib
from tftrain import run_dir, tasks
from tftrain.data import foreign
from tftrain.errors import TftrainError
from tftrain.fileio import join


def read(model_dir: str, strategy_name: str | None = None) -> config_lib.Config:
    """The resolved config of a run (`params.yaml`), optionally with another strategy."""
    params = join(model_dir, run_dir.PARAMS)
    if not tf.io.gfile.exists(params):
        raise TftrainError(f"{model_dir} is not a tftrain run directory (no {run_dir.PARAMS}); "
                           "pass the --model_dir of a `tftrain train` run.")
    config = config_lib.from_yaml_file(params)
    if strategy_name:
        config.runtime.strategy = strategy_name
        config_lib.validate(config)
    return config


def run_of(model_path: str) -> str | None:
    """The run directory `model_path` belongs to (RUN/export[/<version>], RUN/pruned,
    RUN/quantized/model.tflite), or None when it lies in no run (no params.yaml there)."""
    path = model_path.rstrip("/")
    for _ in range(3):
        parent = os.path.dirname(path)
        if os.path.basename(path) in (run_dir.EXPORT, run_dir.PRUNED, run_dir.QUANTIZED):
            run = parent or "."
            return run if tf.io.gfile.exists(join(run, run_dir.PARAMS)) else None
        if not parent or parent == path:
            return None
        path = parent
    return None


@dataclasses.dataclass(frozen=True)
class RunData:
    """How a run reads its data: its config's whole `data` section (see the module doc)."""

    data: config_lib.DataConfig

    @classmethod
    def of(cls, model_dir: str) -> "RunData":
        """The data of the run in `model_dir` (its params.yaml)."""
        return cls(read(model_dir).data)

    def split(self, split: str | None = None) -> str:
        """`split`, or when None the run's test split (`data.test_split`)."""
        return split or self.data.test_split

    def manifest(self) -> dict:
        """The run's dataset manifest (dataset.json, or the description of foreign TFRecords)."""
        return foreign.read_manifest(self.data)

    def load(self, split: str, batch_size: int | None = None, *, training: bool = False,
             **options) -> tf.data.Dataset:
        """`tftrain.data.load` of `split` as the run reads it (its batch size by default)."""
        return data_lib.load(self.data.dir, split, batch_size or self.data.batch_size,
                             training=training, **self.load_kwargs(), **options)

    def load_kwargs(self) -> dict:
        """The keyword arguments of `tftrain.data.load` (and `load_distributed`) that read the
        run's data: format, pipeline, options and info (see `foreign.load_kwargs`)."""
        return foreign.load_kwargs(self.data)


def run_task(config: config_lib.Config):
    """The task a run trained (its params.yaml's `task`), on its dataset."""
    return tasks.from_config(config, RunData(config.data).manifest(), training=False)

"""A test's own DTensor script (not a `tftrain` command) as a process of its own, forked from
the server that `tests/forked_cli.py` forks `tftrain` commands from, instead of a fresh
interpreter: the server imported TensorFlow and tftrain once (the ~5 s of CPU a fresh
interpreter spends again) and ran no TensorFlow op, so the child still configures its own
devices (the 4 virtual CPUs of a 2x2 mesh; the pytest process has 2).

`run_script(SCRIPT, args, ...)` is `subprocess.run([python, "-c", SCRIPT, *args],
capture_output=True, text=True, timeout=...)` in such a child (`tftrain.forked`'s `entry`):
its own session, the given working directory and environment (but for the variables TensorFlow
reads while it is imported, as for `forked_cli`), `sys.argv == ["-c", *args]`, the script run
as `__main__`; the exit code (or -signal), stdout and stderr.
"""
from __future__ import annotations

import os
import subprocess
import sys

from tests import forked_cli

ENTRY = f"{__name__}:script_main"

# The start of a script that trains digits' MLP on digits_dtensor's batch:2,model:2 mesh,
# run as `run_script(MLP_ON_MESH + rest, [data_dir, overrides])`: the config (digits_dtensor
# with `overrides`), the mesh, the MLP (no dropout, seed 0) and its sharded twin (`sharded`,
# laid out by `plan`), the first 32 training examples (`x`, `y`), the loss, and `dataset`:
# those 32 examples every step, split over the mesh's batch dimension.
MLP_ON_MESH = r'''
import json, sys
import tftrain  # noqa: F401
from tftrain import config as config_lib, models
from tftrain.training import optimizers, steps
from tftrain.runtime import dtensor as dtensor_runtime
from tftrain.data import reader

data_dir = sys.argv[1]
config = config_lib.build_config("digits_dtensor", {}, f"data.dir={data_dir},{sys.argv[2]}")
mesh, dims = dtensor_runtime.create_mesh(config.runtime)
import numpy as np, tensorflow as tf, tf_keras as keras
from tensorflow.experimental import dtensor

keras.backend.experimental.enable_tf_random_generator()
keras.utils.set_random_seed(0)
model = models.build_model("mlp", {"dropout": 0}, (8, 8, 1), 10)
plan = dtensor_runtime.resolve_layouts(model, "mlp", {}, dims)
sharded = dtensor_runtime.build_sharded(model, mesh, plan)
x, y = next(iter(reader.load(data_dir, "train", 32, training=False)))
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
dataset = dtensor.DTensorDataset(
    tf.data.Dataset.from_tensor_slices((x, y)).repeat(), mesh=mesh, global_batch_size=32,
    batch_dim="batch", layouts=(dtensor.Layout.batch_sharded(mesh, "batch", 4),
                                dtensor.Layout.batch_sharded(mesh, "batch", 1)))
'''


def script_main(argv: list) -> None:
    """The child's entry point: `argv` is `["tftrain", SCRIPT, *args]`."""
    script, args = argv[1], argv[2:]
    sys.argv = ["-c", *args]
    exec(compile(script, "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102


def run_script(script: str, args, cwd, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`script` with `args` in a forked child (see the module docstring); a child still running
    after `timeout` seconds is killed with its process group and TimeoutExpired raised."""
    args = [os.fspath(a) for a in args]
    command = ["python", "-c", "<script>", *args]
    try:
        done = forked_cli.run([script, *args], cwd=cwd, env=env, timeout=timeout, entry=ENTRY)
    except subprocess.TimeoutExpired:
        raise subprocess.TimeoutExpired(command, timeout) from None
    return subprocess.CompletedProcess(command, done.returncode, done.stdout, done.stderr)

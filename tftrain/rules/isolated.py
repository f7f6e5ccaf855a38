"""The whole `tftrain check --target=tpu`, in a child process that cannot touch the TPU.

`train --strategy=tpu` must not run a TensorFlow op before the TPU is initialized, and on a TPU
VM its TensorFlow has already loaded libtpu, which holds the TPU. So before connecting, `run`
starts a child Python with `TPU_LOAD_LIBRARY=0` (its TensorFlow does not load libtpu, so the
TPU stays the parent's) and `CUDA_VISIBLE_DEVICES=""` (no GPU either), on the parent's import
path (a `model.name=my.module:fn` resolves there as here), and hands it the resolved config as
YAML. The child (`tftrain.check.isolated.main`, started by name: this layer imports nothing
above it) runs `check.run`, what `tftrain check --target=tpu` runs, on its CPU
and writes the findings as JSON; the parent turns them back into a `Report`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

from absl import logging

from tftrain import config_schema as config_lib
from tftrain.rules.report import Finding, Report, Target
from tftrain.errors import ConfigError

CHILD_ENV = {"TPU_LOAD_LIBRARY": "0", "CUDA_VISIBLE_DEVICES": ""}
TIMEOUT = 900  # seconds; a check that takes longer is abandoned (with a warning), not an error
_BOOTSTRAP = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
              "from tftrain.check import isolated; sys.exit(isolated.main(sys.argv[2]))")


def run(config, target: Target, model_dir: str | None, convert_data: bool) -> Report | None:
    """The child's report of `check.run(config, target, ...)`; None when it timed out.

    Raises ConfigError (with the child's last line) when the child ended without a report.
    """
    with tempfile.TemporaryDirectory(prefix="tftrain-check-") as tmp:
        config_path = os.path.join(tmp, "config.yaml")
        with open(config_path, "w", encoding="utf-8") as f:
            f.write(config_lib.to_yaml(config))
        request = {"config": config_path, "target": dataclasses.asdict(target),
                   "model_dir": model_dir, "convert_data": convert_data,
                   "report": os.path.join(tmp, "report.json")}
        request_path = os.path.join(tmp, "request.json")
        with open(request_path, "w", encoding="utf-8") as f:
            json.dump(request, f)
        logging.info("checking the run before connecting to the TPU (tftrain check --target=tpu, "
                     "in a child process on the CPU)")
        started = time.monotonic()
        try:
            done = subprocess.run([sys.executable, "-c", _BOOTSTRAP, json.dumps(sys.path),
                                   request_path], env=child_environment(),
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            logging.warning("the check before connecting to the TPU did not end within %ds: "
                            "not checked (`tftrain check --target=tpu` runs it alone)", TIMEOUT)
            return None
        if not os.path.exists(request["report"]):
            last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            raise ConfigError(f"the check before connecting to the TPU stopped (exit code "
                              f"{done.returncode}): {last[:300]}; `tftrain check --target=tpu` "
                              "with the same --config and --params_override shows it all")
        with open(request["report"], encoding="utf-8") as f:
            found = json.load(f)
    logging.info("checked before connecting to the TPU in %.1fs", time.monotonic() - started)
    return Report(target, [Finding(**finding) for finding in found["findings"]])


def child_environment() -> dict:
    """This process's environment with libtpu and GPUs hidden, and XLA's quick CPU compile."""
    return {**os.environ, **CHILD_ENV,
            "XLA_FLAGS": quick_compile_flags(os.environ.get("XLA_FLAGS", ""))}


QUICK_COMPILE = "--xla_backend_optimization_level=0"


def quick_compile_flags(flags: str) -> str:
    """`XLA_FLAGS` for a process that only checks: `flags` plus no LLVM optimization of the CPU
    code (unless they set the level). Whether an op compiles is decided before that step, so
    the verdict is the same, sooner (configs/digits_tpu.yaml, measured on 2 busy cores: the
    whole check 101 s -> 58 s at load 12, the check before connecting 25.7 s -> 22.8 s at 3)."""
    if "--xla_backend_optimization_level" in flags:
        return flags
    return f"{flags} {QUICK_COMPILE}".strip()

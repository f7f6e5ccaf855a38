"""The whole `tftrain check --target=tpu`, in a child process that cannot touch the TPU.

`train --strategy=tpu` must not run a TensorFlow op before the TPU is initialized, and on a TPU
VM its TensorFlow has already loaded libtpu, which holds the TPU. So before connecting, `run`
starts a child Python with `TPU_LOAD_LIBRARY=0` (its TensorFlow does not load libtpu, so the
TPU stays the parent's) and `CUDA_VISIBLE_DEVICES=""` (no GPU either), on the parent's import
path (a `model.name=my.module:fn` resolves there as here), and hands it the resolved config as
YAML. The child (`main`) runs `check.run`, what `tftrain check --target=tpu` runs, on its CPU
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

from tftrain.check.report import Finding, Report, Target
from tftrain.errors import ConfigError

CHILD_ENV = {"TPU_LOAD_LIBRARY": "0", "CUDA_VISIBLE_DEVICES": ""}
TIMEOUT = 900  # seconds; a check that takes longer is abandoned (with a warning), not an error
_BOOTSTRAP = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
              "from tftrain.check import isolated; sys.exit(isolated.main(sys.argv[2]))")


def run(config, target: Target, model_dir: str | None, convert_data: bool) -> Report | None:
    """The child's report of `check.run(config, target, ...)`; None when it timed out.

    Raises ConfigError (with the child's last line) when the child ended without a report.
    """
    from tftrain import config as config_lib

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
    from tftrain.check import xla

    return {**os.environ, **CHILD_ENV,
            "XLA_FLAGS": xla.quick_compile_flags(os.environ.get("XLA_FLAGS", ""))}


def main(request_path: str) -> int:
    """The child: runs the check of the request and writes its findings (JSON); returns 0."""
    from tftrain import log_filter, quiet_start

    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    log_filter.install()
    quiet_start.import_tensorflow()
    from tftrain import check
    from tftrain import config as config_lib

    config = config_lib.build_config(request["config"])
    report = check.run(config, Target(**request["target"]), request["model_dir"],
                       request["convert_data"])
    partial = request["report"] + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump({"findings": [dataclasses.asdict(f) for f in report.findings]}, f)
    os.replace(partial, request["report"])
    return 0

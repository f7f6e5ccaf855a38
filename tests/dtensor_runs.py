"""DTensor runs that several test files ask questions of, each trained once per `make test`
(`tests/shared_runs.py`'s `built_once`: one process builds it, the others wait and reuse it).

A test module imports the fixture it reads (`from tests.dtensor_runs import
dtensor_adafactor_run`); the run directory is read-only.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.shared_runs import _records, built_once

# Adafactor with its state split over the mesh's batch dimension (ZeRO-1), on digits_dtensor's
# batch:2,model:2 mesh, 3 epochs: the SIGTERM, sent once the first epoch's backup is seen, has
# two epochs to land in (with 2 epochs, a digits_dtensor run was seen taking it only at step 37
# of the second's 44).
ADAFACTOR_SHARDED = ("train.epochs=3,train.optimizer=adafactor,train.learning_rate=0.01,"
                     "runtime.shard_optimizer_state=true")


@pytest.fixture(scope="session")
def dtensor_adafactor_run(digits_dir, tmp_path_factory) -> Path:
    """`tftrain train --config=digits_dtensor` with ADAFACTOR_SHARDED, SIGTERMed after its
    first backup (it backs up and exits 143) and run again with the same command to the end
    (`tests.test_dtensor.interrupted_then_resumed`); the run directory (read-only).
    tests/test_optimizer_state.py asks whether the batch-split slots were saved and restored and
    the run learned; tests/test_memory_plan.py whether `tftrain check` plans the bytes it held.

    The run may have been trained in another process, on that process's `digits_dir`: the same
    records (checked here, shard by shard)."""
    def build(directory: Path) -> None:
        from tests.test_dtensor import interrupted_then_resumed

        run = directory / "run"
        interrupted_then_resumed(["train", "--config=digits_dtensor", f"--model_dir={run}",
                                  f"--params_override=data.dir={digits_dir},{ADAFACTOR_SHARDED}"],
                                 run)

    run = built_once(tmp_path_factory, "dtensor_adafactor_run", build) / "run"
    trained_on = json.loads((run / "summary.json").read_text())["data_dir"]
    assert _records(trained_on) == _records(digits_dir), (
        f"the shared run was trained on {trained_on}, whose records differ from {digits_dir}")
    return run

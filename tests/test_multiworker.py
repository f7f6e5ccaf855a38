"""MultiWorkerMirrored training with real worker processes on loopback.

Two workers train the digits config (converted on first use by the chief) to the same accuracy
bar as one worker; only the chief writes the run's files; both end with identical weights;
the export evaluates; a killed worker ends the launch with a clear message, and launching
the same command again resumes from the backup.
"""
import json
import os
import re

import numpy as np
import pytest
import yaml

from tests import documented
from tests.launch_testutil import Running
from tftrain.runtime.launch import free_ports
from tftrain.engine.export import saved_model_dir

EPOCHS = 5  # one worker needs about as many for >= 0.95 test accuracy on digits
BOUND = 420  # seconds any launch here may take before the test calls it a hang


@pytest.fixture(scope="module")
def two_worker_run(tmp_path_factory):
    """One 2-worker launch of the digits config from an empty directory, shared by the tests."""
    root = tmp_path_factory.mktemp("two_workers")
    weights, worker_tmp = root / "weights", root / "worker_tmp"
    worker_tmp.mkdir()
    # README's command as written, but for where it writes and fewer epochs.
    args = documented.replaced(documented.args(
        "tftrain launch --num_workers=2 -- train --config=digits --model_dir=runs/mw"),
        model_dir=str(root / "run"))
    run = Running([*args, f"--params_override=train.epochs={EPOCHS}"],
                  cwd=root, env={"TFTRAIN_DUMP_WEIGHTS_DIR": str(weights), "TMPDIR": str(worker_tmp)})
    try:
        code = run.wait(BOUND + 60)
    finally:
        run.kill_all()
    assert code == 0, run.tail()
    return root, run


def test_two_workers_reach_the_one_worker_accuracy_bar(two_worker_run):
    root, run = two_worker_run
    summary = json.loads((root / "run/summary.json").read_text())
    assert summary["strategy"] == "multi_worker_mirrored"
    assert summary["num_workers"] == 2 and summary["num_replicas"] == 2
    assert summary["epochs"] == EPOCHS
    assert summary["eval"]["split"] == "test" and summary["eval"]["accuracy"] >= 0.95
    # Each worker's lines are prefixed; both report the same (all-reduced) test metrics.
    results = [line.split("] ", 1)[1] for line in run.lines
               if re.match(r"\[worker [01]\] test split:", line)]
    assert len(results) == 2 and results[0] == results[1]
    assert "[launch] chief finished with exit code 0" in run.output


def test_the_chief_converts_the_dataset_once(two_worker_run):
    root, run = two_worker_run
    manifest = json.loads((root / "data/digits/dataset.json").read_text())
    assert sum(s["num_examples"] for s in manifest["splits"].values()) == 1797
    converting = [line for line in run.lines if "converting its embedded data with pipeline" in line]
    assert len(converting) == 1 and converting[0].startswith("[worker 0]")


def test_only_the_chief_writes_run_files(two_worker_run):
    root, _ = two_worker_run
    run_dir = root / "run"
    params = yaml.safe_load((run_dir / "params.yaml").read_text())
    assert params["train"]["epochs"] == EPOCHS
    assert list(run_dir.glob("export/*/saved_model.pb"))
    for logs in ("logs/train", "logs/validation"):
        assert [f for f in os.listdir(run_dir / logs) if f.startswith("events.out")]
    everything = [os.path.join(d, f) for d, dirs, files in os.walk(run_dir) for f in dirs + files]
    assert not [p for p in everything if "workertemp" in p or p.endswith(".tmp")], everything
    assert not (run_dir / "backup").exists()  # removed once summary.json was written
    # The non-chief worker saved into its own temporary directory, removed afterwards.
    # (Python's __pycache__ of the modules AutoGraph generates in TMPDIR is not tftrain's.)
    assert [name for name in os.listdir(root / "worker_tmp") if name != "__pycache__"] == []


def test_weights_are_equal_on_both_workers(two_worker_run):
    root, _ = two_worker_run
    chief = np.load(root / "weights/worker-0.npz")
    other = np.load(root / "weights/worker-1.npz")
    assert len(chief.files) == len(other.files) > 0
    for name in chief.files:
        np.testing.assert_array_equal(chief[name], other[name])
    # ... and they are the weights of the chief's export.
    import tf_keras as keras

    exported = keras.models.load_model(saved_model_dir(str(root / "run/export")), compile=False).get_weights()
    for name, array in zip(chief.files, exported):
        np.testing.assert_array_equal(chief[name], array)


def test_the_chief_export_loads_and_evaluates(two_worker_run, cli):
    root, _ = two_worker_run
    assert cli("evaluate", f"--model={root}/run/export", f"--data={root}/data/digits",
               "--split=test", f"--output={root}/eval.json") == 0
    evaluated = json.loads((root / "eval.json").read_text())
    summary = json.loads((root / "run/summary.json").read_text())
    assert evaluated["accuracy"] >= 0.95
    assert abs(evaluated["accuracy"] - summary["eval"]["accuracy"]) < 1e-6


def test_worker_hosts_flags_without_a_launcher(tmp_path, digits_dir):
    """Two `tftrain train --worker_hosts=... --task_index=i` processes form one cluster."""
    hosts = ",".join(f"127.0.0.1:{port}" for port in free_ports(2))
    args = ["train", f"--worker_hosts={hosts}", f"--model_dir={tmp_path / 'run'}",
            f"--params_override=train.epochs=1,data.dir={digits_dir},"
            "model.params={filters: [8], dense_units: 16}"]
    workers = [Running(args + [f"--task_index={i}"], cwd=tmp_path) for i in range(2)]
    try:
        codes = [w.wait(BOUND) for w in workers]
    finally:
        for w in workers:
            w.kill_all()
    assert codes == [0, 0], workers[0].tail() + workers[1].tail()
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["strategy"] == "multi_worker_mirrored" and summary["num_workers"] == 2
    assert "worker 1 of 2 done; the chief writes the run's files" in workers[1].output

"""Pipeline stages x workers: `tftrain launch --num_workers=2 -- train --strategy=pipeline` on
loopback, each worker holding the 2 stages on 2 virtual CPU devices and training on its half of
every batch, each stage's gradients summed over the workers by collectives of its own
(`tftrain.runtime.pipeline_workers`).

One launch answers the questions, killed once: worker 1 is SIGKILLed in the second epoch after
the chief's backup of one of its steps, `--max_restarts=3` starts both again, and the run
resumes from the chief's backup (the other worker writes none). Its weights on both workers are
equal bit for bit, and equal one device's uninterrupted run of the same batches within 1e-5
(deterministic, SGD, 2 micro-batches per worker); the metrics the
workers report are those of the whole batches (equal on both); only the chief wrote the run's
files, and the other wrote nothing (not even in its temporary directory). The parts that need
no cluster are checked here too: each worker's slice of a batch, the collectives' keys, the
batch's split.
"""
import json
import os
import re
import signal

import numpy as np
import pytest
import tensorflow as tf

from tests import documented, forked_cli
from tests.launch_testutil import Running, wait_for_a_new_chief_backup, wait_gone
from tftrain import config as config_lib
from tftrain.data.reader import WorkerSlice
from tftrain.engine.pipeline_backend import _check_split_over_workers
from tftrain.errors import ConfigError
from tftrain.runtime import pipeline_workers

BOUND = 300
STEPS = 4  # per epoch, backed up after each: the kill lands with steps of epoch 2 to go
OVERRIDES = ("model.params={width: 32, num_layers: 2, num_heads: 2, mlp_width: 64},"
             f"train.epochs=2,train.steps_per_epoch={STEPS},train.optimizer=sgd,"
             "train.learning_rate=0.1,train.warmup_steps=0,train.lr_schedule=constant,"
             "train.deterministic=true,runtime.microbatches=2,"
             "train.validation_steps=1,train.test_steps=1")
EPOCH_LINE = re.compile(rf"^\[worker (\d)\] {STEPS}/{STEPS} - .* - loss: (\d+\.\d+) - "
                        r"accuracy: (\d\.\d+) - perplexity: (\d+\.\d+)")


def _kill_worker_1_in_epoch_2(run, model_dir) -> None:
    """SIGKILLs worker 1 once the chief has backed up a step of the second epoch."""
    run.wait_for_index(r"^\[worker 0\] Epoch 2/2", BOUND)
    wait_for_a_new_chief_backup(run, model_dir, BOUND)
    os.kill(run.worker_pids()[1], signal.SIGKILL)


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory, text_dir):
    """The launch (killed once, resumed) and one device's run of the same batches."""
    root = tmp_path_factory.mktemp("pipeline_workers")
    worker_tmp = root / "worker_tmp"
    worker_tmp.mkdir()
    # The pipeline guide's command as written, but for where it writes, the session's text data
    # and OVERRIDES (a smaller model, SGD and deterministic ops: comparable with one device).
    args = documented.replaced(documented.args(
        "tftrain launch --num_workers=2 --max_restarts=3 -- train --config=text_lm "
        "--model_dir=runs/text_lm_workers --strategy=pipeline"), model_dir=str(root / "run"))
    overrides = f"--params_override=data.dir={text_dir},{OVERRIDES}"
    run = Running([*args, f"{overrides},train.backup_every_steps=1"],
                  cwd=root, env={"TFTRAIN_DUMP_WEIGHTS_DIR": str(root / "weights"),
                                 "TMPDIR": str(worker_tmp)})
    pids = []
    try:
        _kill_worker_1_in_epoch_2(run, root / "run")
        code = run.wait(BOUND)
        pids = [int(m.group(1)) for m in (re.match(r"\[launch\] worker \d: pid (\d+)", line)
                                           for line in run.lines) if m]
    finally:
        run.kill_all()
    one = forked_cli.run(["train", "--config=text_lm", f"--model_dir={root / 'one'}", overrides],
                         cwd=root, timeout=BOUND,
                         env={**os.environ, "TFTRAIN_DUMP_WEIGHTS_DIR": str(root / "one_weights")})
    return {"root": root, "code": code, "run": run, "pids": pids, "one": one}


def test_the_run_heals_and_resumes_from_the_chiefs_backup(killed_and_resumed):
    run, code = killed_and_resumed["run"], killed_and_resumed["code"]
    assert code == 0, run.tail()
    assert wait_gone(killed_and_resumed["pids"]) and len(killed_and_resumed["pids"]) == 4
    assert re.search(r"^\[launch\] worker 1 was killed by SIGKILL at .*; restart 1 of 3: ",
                     run.output, re.M), run.output
    resumed = re.findall(r"^\[worker (\d)\] .*resumed from epoch 2 step (\d+) ", run.output, re.M)
    assert sorted(worker for worker, _ in resumed) == ["0", "1"], run.output
    assert len({step for _, step in resumed}) == 1 and int(resumed[0][1]) >= 1, resumed
    summary = json.loads((killed_and_resumed["root"] / "run" / "summary.json").read_text())
    assert summary["strategy"] == "pipeline" and summary["restarts"] == 1, summary
    assert (summary["num_workers"], summary["num_replicas"]) == (2, 2), summary
    assert summary["pipeline"]["replicas"] == 1 and summary["steps"] == 2 * STEPS, summary


def test_both_workers_end_with_one_devices_weights(killed_and_resumed):
    root, one = killed_and_resumed["root"], killed_and_resumed["one"]
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    chief, other = (np.load(root / "weights" / f"worker-{i}.npz") for i in range(2))
    reference = np.load(root / "one_weights" / "worker-0.npz")
    assert len(chief.files) == len(reference.files) > 10
    for name in chief.files:
        np.testing.assert_array_equal(chief[name], other[name])
    largest = max(float(np.abs(chief[n] - reference[n]).max()) for n in chief.files)
    assert largest < 1e-5, largest
    moved = max(float(np.abs(chief[n]).max()) for n in chief.files)
    assert moved > 0.1, moved  # trained weights, not zeros on both sides
    ours = json.loads((root / "run" / "summary.json").read_text())["eval"]
    theirs = json.loads((root / "one" / "summary.json").read_text())["eval"]
    assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-4), (ours, theirs)


def test_the_workers_report_the_metrics_of_the_whole_batches(killed_and_resumed):
    lines = [EPOCH_LINE.match(line) for line in killed_and_resumed["run"].lines]
    last = {m.group(1): m.groups()[1:] for m in lines if m}  # each worker's last epoch line
    assert sorted(last) == ["0", "1"] and last["0"] == last["1"], last


def test_only_the_chief_writes_the_run_and_the_others_leave_nothing(killed_and_resumed):
    root = killed_and_resumed["root"]
    assert sorted(os.listdir(root / "run")) == sorted(os.listdir(root / "one"))  # one device's
    exports = [name for name in os.listdir(root / "run" / "export") if not name.startswith(".")]
    assert len(exports) == 1, exports  # one writer
    assert not [name for name in os.listdir(root / "worker_tmp") if name.startswith("tftrain")]


# --- without a cluster ------------------------------------------------------------------------

def test_each_worker_takes_its_part_of_every_accumulated_group():
    batch = {"ids": tf.reshape(tf.range(16 * 3), [16, 3]), "label": tf.range(16)}
    parts = [WorkerSlice(index, 2, groups=2).of(batch) for index in range(2)]
    assert parts[0]["label"].numpy().tolist() == [0, 1, 2, 3, 8, 9, 10, 11]
    assert parts[1]["label"].numpy().tolist() == [4, 5, 6, 7, 12, 13, 14, 15]
    assert parts[1]["ids"].shape == (8, 3) and parts[1]["ids"][0].numpy().tolist() == [12, 13, 14]


def test_every_reduction_has_a_collective_instance_of_its_own():
    workers = pipeline_workers.Workers(count=2, index=1)
    keys = [workers.instance_key(stage, purpose, slot) for stage in range(64)
            for purpose in pipeline_workers.PURPOSES for slot in range(pipeline_workers.MAX_DTYPES)]
    assert len(set(keys)) == len(keys) and min(keys) >= pipeline_workers.INSTANCE_KEY_BASE
    assert not workers.chief and pipeline_workers.Workers(2, 0).chief


def test_a_batch_that_does_not_split_is_refused_before_the_collectives_start(monkeypatch):
    """Every worker stops at the config error at once: none has started the collective
    runtime, so none waits on a peer that has stopped."""
    from tftrain.engine.pipeline_backend import PipelineBackend

    def started(runtime, member):
        raise AssertionError("the collective runtime started before the config was checked")

    monkeypatch.setattr(pipeline_workers, "start", started)
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "worker", "index": 1}}))
    config = config_lib.build_config("text_lm", {}, "runtime.strategy=pipeline,"
                                     "runtime.microbatches=4,data.batch_size=12")
    with pytest.raises(ConfigError, match=r"data.batch_size=12 must split over 2 workers x "
                                          r"runtime.pipeline_replicas=1 x runtime.microbatches=4"):
        PipelineBackend(config)


def test_the_batch_must_split_over_the_workers_replicas_and_micro_batches():
    config = config_lib.build_config("text_lm", {}, "runtime.strategy=pipeline,"
                                     "runtime.pipeline_replicas=2,runtime.microbatches=4,"
                                     "data.batch_size=24")
    _check_split_over_workers(config, 1)
    with pytest.raises(ConfigError, match=r"data.batch_size=24 must split over 2 workers x "
                                          r"runtime.pipeline_replicas=2 x runtime.microbatches=4 "
                                          r"= 16 equal micro-batches: make it a multiple of 16"):
        _check_split_over_workers(config, 2)

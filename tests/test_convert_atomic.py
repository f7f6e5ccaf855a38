"""Interrupting a conversion (kill -9, Ctrl-C) leaves nothing a reader accepts; the rerun completes."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.conftest import PYTHON, REPO
from tests.launch_testutil import interruptible
from tftrain import dir_lock
from tftrain.data import inspection, load
from tftrain.data import manifest as manifest_lib
from tftrain.errors import DataError, TftrainError

N = 3000


def start_conversion(output, *extra, sleep_ms=3):
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen(
        [PYTHON, "-c", "from tftrain.cli import run; run()", "convert",
         "--pipeline=tests.test_convert", f"--pipeline_options=n={N},sleep_ms={sleep_ms}",
         f"--output={output}", "--num_shards=4", *extra],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=interruptible)


def wait_for_shard_files(output, process, timeout=180):
    """Waits until the conversion has begun writing shards (temporary files exist)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.isdir(output) and any(".tmp-" in n and "tfrecord" in n for n in os.listdir(output)):
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    pytest.fail("the conversion never started writing shards")


def descendants(pid):
    """The pids of a process's children, grandchildren, ... (the forkserver and the workers)."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    children = [int(p) for p in out.stdout.split()]
    return children + [d for child in children for d in descendants(child)]


def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def assert_not_a_dataset(output):
    assert not manifest_lib.exists(output)
    with pytest.raises(DataError, match="dataset.json is missing"):
        load(output, "train", 8, training=False)


def test_kill_9_mid_write_then_rerun(tmp_path):
    output = str(tmp_path / "out")
    process = start_conversion(output, "--workers=2")
    wait_for_shard_files(output, process)
    workers = descendants(process.pid)
    assert len(workers) >= 3  # the forkserver and two workers
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    # The workers die with their parent (PR_SET_PDEATHSIG) and publish nothing.
    deadline = time.monotonic() + 30
    while any(map(running, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [w for w in workers if running(w)]
    assert_not_a_dataset(output)
    # The killed run's lock file is still there, but its lock died with the process.
    assert os.path.exists(os.path.join(output, dir_lock.CONVERT_LOCK))
    # The rerun clears the leftovers and completes (in-process, one worker, to stay fast).
    from tests.test_convert import Pipeline
    from tftrain.data.writer import write_dataset

    manifest = write_dataset(Pipeline(n=N), "", output, num_shards=4, workers=1)
    assert sum(s["num_examples"] for s in manifest["splits"].values()) == N
    assert not [n for n in os.listdir(output) if "tmp" in n]
    assert inspection.verify(output) == []


def test_ctrl_c_stops_cleanly(tmp_path):
    output = str(tmp_path / "out")
    # Slow rows (a minute in all) so that a loaded machine cannot finish before the signal lands.
    process = start_conversion(output, "--workers=1", sleep_ms=20)
    wait_for_shard_files(output, process)
    process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=180)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert "interrupted" in err
    assert_not_a_dataset(output)
    assert [n for n in os.listdir(output) if n.endswith(".tfrecord") or ".tmp" in n] == []


def test_a_second_conversion_into_the_same_directory_is_refused(tmp_path):
    output = str(tmp_path / "out")
    process = start_conversion(output, "--workers=1")
    try:
        wait_for_shard_files(output, process)
        from tests.test_convert import Pipeline
        from tftrain.data.writer import write_dataset

        holder = rf"another tftrain convert \(pid {process.pid} on [^)]+\) is writing into {output}"
        with pytest.raises(TftrainError, match=holder):
            write_dataset(Pipeline(n=50), "", output, num_shards=1, workers=1, overwrite=True)
        _, err = process.communicate(timeout=180)
    finally:
        process.kill()
    # The first conversion was not disturbed: it completes, and every shard checks out.
    assert process.returncode == 0, err
    manifest = manifest_lib.read(output)
    assert sum(s["num_examples"] for s in manifest["splits"].values()) == N
    assert inspection.verify(output) == []

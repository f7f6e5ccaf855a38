"""Interrupting a conversion (kill -9, Ctrl-C) leaves nothing a reader accepts; the rerun completes.

The conversions run `Pipeline` below, whose rows from `hold_at` on wait for a gate file: the
test sends its signal while every converting process is held mid-conversion (shard files begun,
the rest of the rows not written), so no machine is too slow or too fast for it to land there.
"""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import time

import pytest

from tests import forked_cli, test_convert
from tests.conftest import REPO
from tftrain import dir_lock
from tftrain.data import inspection, load, shard_plan
from tftrain.data import manifest as manifest_lib
from tftrain.errors import DataError, TftrainError

N = 3000
BOUND = 180  # seconds: only for a conversion that never gets where the test waits for it


class Pipeline(test_convert.Pipeline):
    """test_convert's rows (`--pipeline=tests.test_convert_atomic`); with option `gate` (a path),
    encoding row `hold_at` or a later one first waits until that file exists. A process that
    waits says so by creating `<gate>.held-<its pid>`. The default `hold_at` is past the rows the
    converting process encodes for its sample, so only the writing of shards is held."""

    name = "tests.test_convert_atomic"

    def __init__(self, **options):
        super().__init__(**options)
        self.gate = options.get("gate", "")
        self.hold_at = int(options.get("hold_at", shard_plan.SAMPLE_ENCODE))

    def encode(self, row, info):
        if self.gate and row.value >= self.hold_at and not os.path.exists(self.gate):
            open(f"{self.gate}.held-{os.getpid()}", "w").close()
            deadline = time.monotonic() + BOUND
            while not os.path.exists(self.gate):
                if time.monotonic() > deadline:  # the test is gone: do not stay forever
                    raise RuntimeError(f"{self.gate} never appeared")
                time.sleep(0.01)
        return super().encode(row, info)


def start_conversion(output, gate, *extra):
    """`tftrain convert` of `Pipeline` in a process of its own (`tests/forked_cli.py`), its
    stdout and stderr in files beside the gate (`output_of`)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")  # the server imports tests.* (no PYTHONPATH)
    with open(f"{gate}.stdout", "w") as out, open(f"{gate}.stderr", "w") as err:
        process = forked_cli.Popen(
            ["convert", "--pipeline=tests.test_convert_atomic",
             f"--pipeline_options=n={N},gate={gate}", f"--output={output}", "--num_shards=4",
             *extra], cwd=REPO, env=env, stdout=out, stderr=err)
    process.gate = gate
    return process


def output_of(process, timeout=BOUND) -> tuple[str, str]:
    """(stdout, stderr) of a conversion, once it has ended (at most `timeout` seconds)."""
    process.wait(timeout)
    return tuple(pathlib.Path(f"{process.gate}.{name}").read_text()
                 for name in ("stdout", "stderr"))


def wait_until_held(gate, process, count):
    """Waits until `count` processes are held at the gate; returns their pids."""
    folder, prefix = os.path.dirname(gate), os.path.basename(gate) + ".held-"
    deadline = time.monotonic() + BOUND
    while True:
        held = [int(n[len(prefix):]) for n in os.listdir(folder) if n.startswith(prefix)]
        if len(held) >= count:
            return held
        assert process.poll() is None, output_of(process)
        assert time.monotonic() < deadline, f"{len(held)} of {count} processes held after {BOUND}s"
        time.sleep(0.05)


def shards_begun(output):
    """The shard files being written (under temporary names)."""
    return [n for n in os.listdir(output) if ".tmp-" in n and "tfrecord" in n]


def open_gate(gate):
    open(gate, "w").close()


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
    output, gate = str(tmp_path / "out"), str(tmp_path / "gate")
    process = start_conversion(output, gate, "--workers=2")
    try:
        held = wait_until_held(gate, process, 2)  # both workers, mid-conversion
        assert shards_begun(output)
        workers = descendants(process.pid)
        assert set(held) < set(workers) and len(workers) >= 3  # the forkserver and two workers
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        # The forkserver ends with the converting process, and the workers, held mid-row at the
        # gate, with the forkserver: none is left behind (the gate stays closed).
        deadline = time.monotonic() + BOUND
        while any(map(running, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [w for w in workers if running(w)]
    finally:
        open_gate(gate)
        if process.poll() is None:
            process.kill()
    assert not [n for n in os.listdir(output) if n.endswith(".tfrecord")]  # no shard published
    assert_not_a_dataset(output)
    # The killed run's lock file is still there, but its lock died with the process.
    assert os.path.exists(os.path.join(output, dir_lock.CONVERT_LOCK))
    # The rerun clears the leftovers and completes (in-process, one worker, to stay fast).
    from tftrain.data.writer import write_dataset

    manifest = write_dataset(test_convert.Pipeline(n=N), "", output, num_shards=4, workers=1)
    assert sum(s["num_examples"] for s in manifest["splits"].values()) == N
    assert not [n for n in os.listdir(output) if "tmp" in n]
    assert inspection.verify(output) == []


def test_ctrl_c_stops_cleanly(tmp_path):
    output, gate = str(tmp_path / "out"), str(tmp_path / "gate")
    process = start_conversion(output, gate, "--workers=1")
    try:
        assert wait_until_held(gate, process, 1) == [process.pid]  # it converts in-process
        assert shards_begun(output)
        process.send_signal(signal.SIGINT)
        open_gate(gate)  # the rows go on: only the Ctrl-C can keep the conversion from finishing
        _, err = output_of(process)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert "interrupted" in err
    assert_not_a_dataset(output)
    assert [n for n in os.listdir(output) if n.endswith(".tfrecord") or ".tmp" in n] == []


def test_a_second_conversion_into_the_same_directory_is_refused(tmp_path):
    output, gate = str(tmp_path / "out"), str(tmp_path / "gate")
    process = start_conversion(output, gate, "--workers=1")
    try:
        wait_until_held(gate, process, 1)  # holding the directory's lock, mid-conversion
        from tftrain.data.writer import write_dataset

        holder = rf"another tftrain convert \(pid {process.pid} on [^)]+\) is writing into {output}"
        with pytest.raises(TftrainError, match=holder):
            write_dataset(test_convert.Pipeline(n=50), "", output, num_shards=1, workers=1,
                          overwrite=True)
        open_gate(gate)
        _, err = output_of(process)
    finally:
        process.kill()
    # The first conversion was not disturbed: it completes, and every shard checks out.
    assert process.returncode == 0, err
    manifest = manifest_lib.read(output)
    assert sum(s["num_examples"] for s in manifest["splits"].values()) == N
    assert inspection.verify(output) == []

"""`tftrain launch` with real processes: a failing worker, --timeout, signals to the launcher, and
a killed launcher never leave a hang or orphaned workers. (Training runs are in
test_multiworker.py; long-running workers here are tf.data service dispatchers, which run
until stopped.)"""
import json
import os
import signal
import time

import pytest

from tests.launch_testutil import Running, pid_alive
from tftrain.runtime import cluster
from tftrain.errors import ConfigError
from tftrain.runtime.launch import free_ports

BOUND = 180
FOREVER = ["data_service", "--dispatcher"]  # a tftrain command that runs until it is stopped


def _wait_gone(pids, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.2)
    return not any(pid_alive(p) for p in pids)


def _launch(tmp_path, *args):
    return Running(["launch", *args], cwd=tmp_path)


def test_a_failing_worker_ends_the_launch_with_its_last_lines(tmp_path):
    run = _launch(tmp_path, "--num_workers=2", f"--timeout={BOUND}", "--", "train",
                  "--config=no_such_config", f"--model_dir={tmp_path / 'run'}")
    try:
        code = run.wait(BOUND)
    finally:
        run.kill_all()
    assert code == 2, run.output  # the worker's own exit code (a config error)
    assert run.output.count("[launch] worker ") >= 3  # two pids, then the failure
    failure = [line for line in run.lines if "exited with code 2; stopping the other workers" in line]
    assert len(failure) == 1, run.output
    tail = run.output.split(failure[0], 1)[1]
    assert "config 'no_such_config' not found" in tail
    assert "[worker 0] tftrain train: error:" in run.output or "[worker 1] tftrain train: error:" in run.output
    assert _wait_gone(run.worker_pids().values())


def test_timeout_stops_every_worker(tmp_path):
    # The workers run until stopped, so whenever the timeout passes (here while they may still be
    # starting up) both are running: no need to wait for them, or for a longer timeout. Stopping
    # started dispatchers is what test_a_signal_to_the_launcher_stops_all_workers shows.
    run = _launch(tmp_path, "--num_workers=2", "--timeout=1", "--grace=5", "--", *FOREVER)
    try:
        code = run.wait(BOUND)
    finally:
        run.kill_all()
    assert code == 124, run.output
    assert "[launch] timeout: --timeout=1s passed with worker(s) 0, 1 still running" in run.output
    assert "worker 0, last lines:" in run.output
    assert _wait_gone(run.worker_pids().values())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_stops_all_workers(tmp_path, sig):
    run = _launch(tmp_path, "--num_workers=2", f"--timeout={BOUND}", "--grace=5", "--", *FOREVER)
    try:
        run.wait_for_line(r"^\[worker 1\] dispatcher: grpc://", BOUND)
        run.wait_for_line(r"^\[worker 0\] dispatcher: grpc://", BOUND)
        run.process.send_signal(sig)
        code = run.wait(60)
    finally:
        run.kill_all()
    assert code == 128 + sig
    assert f"[launch] received {signal.Signals(sig).name}: stopping all workers" in run.output
    assert _wait_gone(run.worker_pids().values())


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _command_line(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def test_a_killed_launcher_takes_its_workers_and_their_server_along(tmp_path):
    run = _launch(tmp_path, "--num_workers=2", "--", *FOREVER)
    try:
        run.wait_for_line(r"^\[launch\] worker 1: pid", BOUND)
        pids = list(run.worker_pids().values())
        server = _parent(pids[0])
        assert _parent(server) == run.process.pid and _parent(pids[1]) == server
        # The launcher, forked from a server itself, is one already: its server is its fork
        # (a new interpreter's command line would be `python -c "from multiprocessing...`).
        assert _command_line(server) == _command_line(run.process.pid)
        os.kill(run.process.pid, signal.SIGKILL)
        run.wait(30)
        assert _wait_gone([*pids, server])
    finally:
        run.kill_all()


def test_launch_needs_a_tftrain_command(cli, capsys):
    assert cli("launch", "--num_workers=2") == 2
    assert "no command to launch" in capsys.readouterr().err
    assert cli("launch", "--", "python", "x.py") == 2
    assert "'python' is not a tftrain command" in capsys.readouterr().err


def test_tf_config_from_worker_hosts():
    parsed = json.loads(cluster.make_tf_config(["a:1", "b:2"], 1))
    assert parsed == {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}
    with pytest.raises(ConfigError, match="--task_index=2 is outside the 2 worker"):
        cluster.make_tf_config(["a:1", "b:2"], 2)
    with pytest.raises(ConfigError, match="'a' is not host:port"):
        cluster.make_tf_config(["a", "b:2"], 0)
    with pytest.raises(ConfigError, match="lists an address twice"):
        cluster.make_tf_config(["a:1", "a:1"], 0)


def test_who_is_chief(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert cluster.is_chief() and cluster.num_workers() == 1 and cluster.task() == ("worker", 0)
    monkeypatch.setenv("TF_CONFIG", cluster.make_tf_config(["a:1", "b:2", "c:3"], 2))
    assert not cluster.is_chief() and cluster.num_workers() == 3 and cluster.task() == ("worker", 2)
    monkeypatch.setenv("TF_CONFIG", cluster.make_tf_config(["a:1", "b:2"], 0))
    assert cluster.is_chief()
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": {"chief": ["a:1"], "worker": ["b:2"]}, "task": {"type": "worker", "index": 0}}))
    assert not cluster.is_chief() and cluster.num_workers() == 2
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {}}')
    with pytest.raises(ConfigError, match="TF_CONFIG is not valid"):
        cluster.tf_config()


def test_write_dir_for_non_chief_workers(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("TF_CONFIG", cluster.make_tf_config(["a:1", "b:2"], 0))
    assert cluster.write_dir_for("gs://bucket/run/export") == "gs://bucket/run/export"
    monkeypatch.setenv("TF_CONFIG", cluster.make_tf_config(["a:1", "b:2"], 1))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    written = cluster.write_dir_for("gs://bucket/run/export")
    assert written.startswith(str(tmp_path)) and written.endswith("/export")
    assert os.path.isdir(os.path.dirname(written))
    cluster.cleanup(written, "gs://bucket/run/export")
    assert os.listdir(tmp_path) == []


def test_free_ports_are_distinct():
    ports = free_ports(4)
    assert len(set(ports)) == 4 and all(p > 0 for p in ports)


def test_a_worker_killed_by_a_signal_is_the_cause_over_a_peer_that_exited_with_an_error():
    """Both ended between two polls: the SIGKILLed worker 1 is named, not worker 0, which lost
    its collective to it and exited with code 1 a moment earlier."""
    from tftrain.runtime.launch import Launcher, Worker

    class Ended:
        def __init__(self, code):
            self.returncode = code

        def poll(self):
            return self.returncode

    launcher = Launcher(["train"], 3)
    launcher.workers = [Worker(i, Ended(code), None, None)
                        for i, code in enumerate([1, -signal.SIGKILL, None])]
    assert launcher._failed_worker().index == 1
    assert launcher._failed_worker().describe_exit() == "was killed by SIGKILL"
    launcher.workers[1].process.returncode = None
    assert launcher._failed_worker().index == 0
    launcher.workers[0].process.returncode = 0
    assert launcher._failed_worker() is None

"""A network partition between two workers: two hosts on one machine, cut apart mid-run.

Each worker runs in a network namespace of its own, the two joined by a veth pair (as two
machines by a cable: `--worker_hosts=<address 0>:P,<address 1>:P`). After epoch 3 the link of
host 1 goes down: both processes are alive, but neither reaches the other. Each must end in
the one lost-peer line (none of TensorFlow's native gRPC dump at the default verbosity), and
once the link is up again the same commands resume from the last backup and finish.

Network namespaces need root (CAP_SYS_ADMIN) and iproute2's `ip`: `make test` runs as root on
CI and installs iproute2 when it is missing (Makefile). A worker is a child forked from the
test's server (`tests/forked_cli.py`) that moves itself into its namespace (setns) before it
starts its collective runtime.
"""
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess

import pytest

from tests.launch_testutil import Running, group_gone
from tftrain.runtime.launch import free_ports

pytestmark = pytest.mark.slow

NETNS_ENV = "TFTRAIN_TEST_NETNS"  # the namespace a forked worker enters (this test's only)
CLONE_NEWNET = 0x40000000
ENTRY = "tests.test_partition:train_in_namespace"
EPOCHS = 5
LOST_PEER = re.compile(r"^tftrain train: error: (worker \d|a peer worker) stopped answering "
                       r"\(lost or unhealthy, or the network between the workers cut")
NATIVE_RECORD = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ [\w.]+\.(cc|h):\d+\] ")


def train_in_namespace(argv: list[str]) -> None:
    """A forked worker's entry point: enters the network namespace NETNS_ENV names (the child
    is single-threaded here; the threads and sockets TensorFlow makes later inherit it), then
    runs `tftrain <argv>`."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(os.path.join("/run/netns", os.environ[NETNS_ENV])) as namespace:
        if libc.setns(namespace.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {os.environ[NETNS_ENV]}")
    from tftrain.cli import run

    run(argv)


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                            check=False)
    assert result.returncode == 0, f"ip {' '.join(args)}: {result.stderr}"


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair: [(namespace, link, address)] of host 0
    and host 1; both namespaces (and with them the pair) are deleted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CAP_SYS_ADMIN); `make test` on CI runs as root")
    assert shutil.which("ip"), "iproute2's `ip` is missing: `make test` installs it (apt-get)"
    tag = f"tft{os.getpid() % 100000}"
    hosts = [(f"{tag}h{i}", f"{tag}v{i}", f"10.231.0.{i + 1}") for i in range(2)]
    try:
        for namespace, _, _ in hosts:
            _ip("netns", "add", namespace)
        _ip("link", "add", hosts[0][1], "type", "veth", "peer", "name", hosts[1][1])
        for namespace, link, address in hosts:
            _ip("link", "set", link, "netns", namespace)
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", namespace, "link", "set", "lo", "up")
            _ip("-n", namespace, "link", "set", link, "up")
        yield hosts
    finally:
        for namespace, _, _ in hosts:
            subprocess.run(["ip", "netns", "delete", namespace], capture_output=True,
                           timeout=30, check=False)


def _start(args, hosts, tmp_path):
    return [Running(args + [f"--task_index={i}"], cwd=tmp_path, entry=ENTRY,
                    env={"TMPDIR": str(tmp_path), NETNS_ENV: namespace})
            for i, (namespace, _, _) in enumerate(hosts)]


def _stop(workers):
    for worker in workers:
        if worker.process.poll() is None:
            os.killpg(worker.process.pid, signal.SIGKILL)
            worker.process.wait(30)


@pytest.mark.timeout(900)
def test_a_partition_ends_each_worker_in_one_line_and_the_same_commands_resume(
        two_hosts, tmp_path, digits_dir):
    (port,) = free_ports(1)
    hosts = ",".join(f"{address}:{port}" for _, _, address in two_hosts)
    args = ["train", f"--worker_hosts={hosts}", f"--model_dir={tmp_path / 'run'}",
            f"--params_override=data.dir={digits_dir},model.name=mlp,"
            f"model.params={{hidden_units: [16]}},train.epochs={EPOCHS},train.steps_per_epoch=5"]
    workers = _start(args, two_hosts, tmp_path)
    try:
        for worker in workers:
            worker.wait_for_line(r"^Epoch 4/", 300)  # epoch 3 and its backup are done
        namespace, link, _ = two_hosts[1]
        _ip("-n", namespace, "link", "set", link, "down")
        codes = [worker.wait(300) for worker in workers]
    finally:
        _stop(workers)
    for worker in workers:
        errors = [line for line in worker.lines if ": error: " in line]
        assert len(errors) == 1 and LOST_PEER.match(errors[0]), worker.tail()
        assert "run the same command on every worker again" in errors[0]
        assert "Traceback" not in worker.output, worker.tail()
        dumped = [line for line in worker.lines
                  if NATIVE_RECORD.match(line) or "GRPC" in line or "/job:worker" in line]
        assert not dumped, dumped  # TensorFlow's native dump: only with -v
    assert codes == [1, 1], [w.tail() for w in workers]
    # the chief names the worker it lost
    assert LOST_PEER.match([line for line in workers[0].lines if ": error: " in line][0]).group(
        1) == "worker 1"
    assert all(group_gone(w.process.pid) for w in workers)  # the log filters exited too

    _ip("-n", namespace, "link", "set", link, "up")
    workers = _start(args, two_hosts, tmp_path)
    try:
        codes = [worker.wait(600) for worker in workers]
    finally:
        _stop(workers)
    assert codes == [0, 0], [w.tail() for w in workers]
    assert "resumed from epoch 4 step 0" in workers[0].output, workers[0].tail()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["epochs"] == EPOCHS and summary["num_workers"] == 2, summary

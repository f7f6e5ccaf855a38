"""tf.data service on loopback: a dispatcher and a worker started with `tftrain data_service`,
and training that reads its input through them."""
import json
import logging
import re
import signal

import pytest

from tests import documented
from tests.launch_testutil import Running
from tftrain import config as config_lib
from tftrain.data import service as data_service
from tftrain.errors import ConfigError
from tftrain.runtime.launch import free_ports

START = 120  # seconds a server may take to start on a loaded machine


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """A dispatcher and one worker, each its own `tftrain data_service` process: the scale-out
    page's two commands as written, but on a free port instead of 5050."""
    cwd = tmp_path_factory.mktemp("data_service")
    (port,) = free_ports(1)
    dispatcher = Running(documented.replaced(documented.args(
        "tftrain data_service --dispatcher --port=5050"), port=str(port)), cwd=cwd)
    worker = None
    try:
        dispatcher.wait_for_line(r"^dispatcher: grpc://", START)
        worker = Running(documented.replaced(documented.args(
            "tftrain data_service --worker --dispatcher_address=localhost:5050"),
            dispatcher_address=f"localhost:{port}"), cwd=cwd)
        worker.wait_for_line(r"^worker: .* -> dispatcher localhost", START)
        dispatcher.wait_for_line(r"dispatcher has 1 worker\(s\)", START)
        yield f"127.0.0.1:{port}", dispatcher, worker
        for server in (worker, dispatcher):
            server.process.send_signal(signal.SIGINT)
            assert server.wait(START) == 130, server.tail()
    finally:
        for server in (worker, dispatcher):
            if server:
                server.kill_all()


def _tasks(line: str) -> int:
    return int(re.search(r"worker runs (\d+) task\(s\)", line).group(1))


@pytest.mark.parametrize("mode, policy", [("parallel_epochs", "OFF"),
                                          ("distributed_epoch", "DYNAMIC")])
def test_training_reads_through_the_service(service, mode, policy, cli, tmp_path, digits_dir,
                                            caplog):
    address, _, worker = service
    # The servers are shared by the module's cases: this case's worker output starts here, and
    # its task count is the last one the worker logged before it (a job's task outlives it).
    start = len(worker.lines)
    before = [_tasks(line) for line in worker.lines if "worker runs" in line][-1]
    run = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="absl"):
        assert cli("train", f"--model_dir={run}",
                   f"--params_override=train.epochs=3,data.dir={digits_dir},"
                   f"data.service_address={address},data.service_mode={mode}") == 0
    # The run asked the service for this mode (the policy tf.data was given)...
    assert (f"input pipeline runs on the tf.data service at grpc://{address} ({mode}: "
            f"sharding policy {policy})") in caplog.text
    # ... and the service worker ran a task of this run's job: its count rose during this case.
    index = start
    while True:
        index = worker.wait_for_index(r"worker runs \d+ task\(s\)", 30, start=index)
        if _tasks(worker.lines[index]) > before:
            break
        index += 1
    # What the service delivered was the training data (a run without the service trains as
    # well: this alone would not show the service was used).
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval"]["accuracy"] >= 0.9


def test_service_address_and_mode_are_checked():
    assert data_service.service_target("grpc://host:5050") == "grpc://host:5050"
    assert data_service.service_target("host:5050") == "grpc://host:5050"
    with pytest.raises(ConfigError, match="is not host:port"):
        data_service.service_target("host")
    with pytest.raises(ConfigError, match="data.service_mode='parallel' is not one of"):
        config_lib.build_config("digits", overrides="data.service_mode=parallel")


def test_the_command_says_what_to_start(cli, capsys):
    assert cli("data_service") == 2
    assert "--dispatcher, --worker, or both" in capsys.readouterr().err
    assert cli("data_service", "--worker") == 2
    assert "--worker needs --dispatcher_address" in capsys.readouterr().err

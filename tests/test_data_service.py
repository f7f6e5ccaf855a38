"""tf.data service on loopback: a dispatcher and a worker started with `tftrain data_service`,
and training that reads its input through them."""
import json
import signal

import pytest

from tests.launch_testutil import Running
from tftrain import config as config_lib
from tftrain.data import service as data_service
from tftrain.errors import ConfigError
from tftrain.runtime.launch import free_ports

START = 120  # seconds a server may take to start on a loaded machine


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """A dispatcher and one worker, each its own `tftrain data_service` process."""
    cwd = tmp_path_factory.mktemp("data_service")
    (port,) = free_ports(1)
    dispatcher = Running(["data_service", "--dispatcher", f"--port={port}"], cwd=cwd)
    worker = None
    try:
        dispatcher.wait_for_line(r"^dispatcher: grpc://", START)
        worker = Running(["data_service", "--worker", f"--dispatcher_address=127.0.0.1:{port}"],
                         cwd=cwd)
        worker.wait_for_line(r"^worker: .* -> dispatcher 127.0.0.1", START)
        dispatcher.wait_for_line(r"dispatcher has 1 worker\(s\)", START)
        yield f"127.0.0.1:{port}", dispatcher, worker
        for server in (worker, dispatcher):
            server.process.send_signal(signal.SIGINT)
            assert server.wait(START) == 130, server.tail()
    finally:
        for server in (worker, dispatcher):
            if server:
                server.kill_all()


@pytest.mark.parametrize("mode", ["parallel_epochs", "distributed_epoch"])
def test_training_reads_through_the_service(service, mode, cli, tmp_path, digits_dir):
    address, _, worker = service
    run = tmp_path / "run"
    assert cli("train", f"--model_dir={run}",
               f"--params_override=train.epochs=3,data.dir={digits_dir},"
               f"data.service_address={address},data.service_mode={mode}") == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval"]["accuracy"] >= 0.9
    # The service worker ran the training input (one task per job).
    worker.wait_for_line(r"worker runs [1-9]\d* task\(s\)", 30)


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

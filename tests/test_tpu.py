"""The TPU path: fails fast and cleanly where no TPU can be reached; readiness checks; every
path through tf.io.gfile (a full run on TensorFlow's in-memory `ram://` filesystem)."""
import json
import socket

import pytest
import tensorflow as tf

from tests.launch_testutil import Running
from tftrain import config as config_lib
from tftrain.runtime import tpu
from tftrain.data import reader
from tftrain.errors import ConfigError

FAIL_FAST = 120  # generous bound for "exits within seconds" on a loaded 2-core machine


# A TPU node's hosts cannot read this machine's disk: with local paths the check before
# connecting stops the run first (tests/test_check.py), so these tests use gs:// paths.
_ON_GCS = ("--model_dir=gs://b/run", "--params_override=data.dir=gs://b/digits")


def _train(tmp_path, *flags):
    run = Running(["train", f"--model_dir={tmp_path / 'run'}", *flags], cwd=tmp_path)
    try:
        code = run.wait(FAIL_FAST)
    finally:
        run.kill_all()
    return code, run.output


def _one_clear_error(output: str) -> str:
    errors = [line for line in output.splitlines() if line.startswith("tftrain train: error:")]
    assert len(errors) == 1, output
    assert "Traceback" not in output, output
    return errors[0]


def test_local_tpu_is_missing_here(tmp_path):
    code, output = _train(tmp_path, "--strategy=tpu", "--tpu=local")
    assert code == 1
    error = _one_clear_error(output)
    assert "cannot reach TPU 'local'" in error and "no TPU devices" in error
    assert "docs/tpu.md" in error


def test_tpu_address_where_nothing_listens(tmp_path):
    code, output = _train(tmp_path, "--strategy=tpu", "--tpu=grpc://127.0.0.1:1", *_ON_GCS)
    assert code == 1
    assert "nothing answers at 127.0.0.1:1" in _one_clear_error(output)


def test_tpu_address_that_never_answers_is_bounded(tmp_path):
    """A port that accepts connections but never speaks gRPC: TF would wait forever."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        address = f"grpc://127.0.0.1:{server.getsockname()[1]}"
        code, output = _train(tmp_path, "--strategy=tpu", f"--tpu={address}", _ON_GCS[0],
                              "--params_override=runtime.tpu_timeout=3,data.dir=gs://b/digits")
    assert code == 1
    assert "did not answer within runtime.tpu_timeout=3s" in _one_clear_error(output)


def test_the_tpu_example_config_is_ready_for_a_tpu():
    config = config_lib.build_config("digits_tpu")
    assert config.runtime.strategy == "tpu" and config.runtime.tpu == "local"
    assert config.data.dir.startswith("gs://")
    spec = (tf.TensorSpec([16, 8, 8, 1]), tf.TensorSpec([16], tf.int32))  # digits, per core of 8
    assert tpu.check_static(spec, config, replicas=8) == []  # bf16, steps_per_execution: no advice


def test_tpu_needs_a_tpu_address():
    with pytest.raises(ConfigError, match="runtime.strategy=tpu needs runtime.tpu"):
        config_lib.build_config("digits", {"runtime.strategy": "tpu"})


def _config(**data):
    return config_lib.build_config("digits", overrides=",".join(f"data.{k}={v}" for k, v in data.items()))


def test_readiness_accepts_static_batches_and_gives_advice(digits_dir):
    config = _config(batch_size=64, dir=digits_dir)
    spec = reader.load(digits_dir, "train", 8, training=True).element_spec
    advice = tpu.check_static(spec, config, replicas=8)
    assert any("mixed_bfloat16" in line for line in advice)
    assert any("steps_per_execution" in line for line in advice)
    config.runtime.mixed_precision = "mixed_bfloat16"
    config.train.steps_per_execution = 100
    assert tpu.check_static(spec, config, replicas=8) == []


def test_readiness_rejects_a_dynamic_batch_and_an_uneven_split(digits_dir):
    config = _config(batch_size=64, dir=digits_dir)
    spec = reader.load(digits_dir, "train", 8, training=True, drop_remainder=False).element_spec
    with pytest.raises(ConfigError, match="drop_remainder=True"):
        tpu.check_static(spec, config, replicas=8)
    static = reader.load(digits_dir, "train", 8, training=True).element_spec
    with pytest.raises(ConfigError, match=r"batch_size \(64\) must be divisible .* \(48\)"):
        tpu.check_static(static, config, replicas=48)


def test_readiness_rejects_variable_sized_examples():
    config = _config(batch_size=8)
    images = tf.data.Dataset.from_generator(
        lambda: iter([]), output_signature=(tf.TensorSpec([8, None, None, 3]), tf.TensorSpec([8])))
    with pytest.raises(ConfigError, match=r"static shapes.*\(8, None, None, 3\).*pad it"):
        tpu.check_static(images.element_spec, config, replicas=8)


def test_full_run_on_the_in_memory_filesystem(cli, tmp_path, monkeypatch):
    """Data (converted on first use), run dir, checkpoints, logs, export and summary on ram://."""
    monkeypatch.chdir(tmp_path)
    root = f"ram://test_tpu_{tmp_path.name}"
    assert cli("train", f"--model_dir={root}/run",
               f"--params_override=train.epochs=1,data.dir={root}/digits,data.pipeline=digits,"
               "model.params={filters: [8], dense_units: 16}") == 0
    files = {path[len(root):] for path in tf.io.gfile.glob(f"{root}/run/*")}
    assert {"/run/params.yaml", "/run/summary.json", "/run/export", "/run/logs",
            "/run/checkpoints"} <= files
    assert tf.io.gfile.glob(f"{root}/run/export/*/variables/variables.index")
    assert tf.io.gfile.glob(f"{root}/run/logs/train/events.out.tfevents*")
    with tf.io.gfile.GFile(f"{root}/run/summary.json") as f:
        summary = json.load(f)
    assert summary["data_dir"] == f"{root}/digits"
    assert cli("evaluate", f"--model={root}/run/export", f"--data={root}/digits",
               "--split=test") == 0
    with tf.io.gfile.GFile(f"{root}/run/eval_test.json") as f:
        assert abs(json.load(f)["accuracy"] - summary["eval"]["accuracy"]) < 1e-6
    assert not tf.io.gfile.glob(f"{tmp_path}/*")  # nothing went to the local disk

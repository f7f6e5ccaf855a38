"""`tftrain train` end to end on the embedded digits dataset, through the CLI."""
import json
import os

import tensorflow as tf
import tf_keras as keras
import yaml

from tests import documented
from tests.test_documented_commands import with_override
from tftrain.engine.export import saved_model_dir


def _events(path):
    return [f for f in tf.io.gfile.listdir(path) if f.startswith("events.out.tfevents")]


def test_digits_end_to_end(cli, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the config's data.dir (data/digits) is relative to the cwd
    run = tmp_path / "run"
    assert cli("train", f"--model_dir={run}", "--params_override=train.epochs=4") == 0
    out = capsys.readouterr().out
    assert f"run directory: {run}" in out and "test split:" in out

    # The dataset was converted the first time it was needed.
    manifest = json.loads((tmp_path / "data/digits/dataset.json").read_text())
    assert sum(s["num_examples"] for s in manifest["splits"].values()) == 1797
    assert set(manifest["splits"]) == {"train", "validation", "test"}

    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval"]["split"] == "test" and summary["eval"]["accuracy"] >= 0.9  # 15 epochs: >= 0.95 (make demo test)
    assert summary["epochs"] == 4 and summary["strategy"] == "one_device"
    assert summary["num_replicas"] == 1 and summary["examples_per_second"] > 0
    # The parameter count is the exported model's, variable by variable.
    exported = keras.models.load_model(saved_model_dir(str(run / "export")), compile=False)
    parameters = sum(int(tf.size(v)) for v in exported.weights)
    assert summary["parameters"] == parameters > 0
    # One device holds every weight (float32) and Adam's two moments of each trainable one.
    assert summary["memory"] == {"weights_bytes_per_device": 4 * parameters,
                                 "optimizer_bytes_per_device": 2 * 4 * parameters}
    params = yaml.safe_load((run / "params.yaml").read_text())
    assert params["train"]["epochs"] == 4 and params["model"]["name"] == "cnn"
    assert _events(str(run / "logs/train")) and _events(str(run / "logs/validation"))
    assert tf.io.gfile.glob(str(run / "checkpoints/best*"))
    assert list(run.glob("export/*/saved_model.pb"))  # export/<version>/, as TF Serving reads it
    assert not any(name.endswith(".tmp") for name in os.listdir(run))

    # The export evaluates to the same test accuracy through `tftrain evaluate`.
    assert cli("evaluate", f"--model={run}/export", f"--data={tmp_path}/data/digits", "--split=test") == 0
    evaluated = json.loads((run / "eval_test.json").read_text())
    assert abs(evaluated["accuracy"] - summary["eval"]["accuracy"]) < 1e-6

    # A finished run is not silently retrained.
    assert cli("train", f"--model_dir={run}") == 1
    assert "holds a finished run" in capsys.readouterr().err


def test_new_run_dir_and_mirrored_on_two_cpus(cli, tmp_path, monkeypatch, capsys, digits_dir):
    monkeypatch.chdir(tmp_path)
    args = documented.args(  # the digits header's mirrored command, as written but 1 epoch
        "tftrain train --config=digits --strategy=mirrored --params_override=runtime.cpu_devices=2")
    assert cli(*with_override(args, f"train.epochs=1,data.dir={digits_dir}")) == 0
    out = capsys.readouterr().out
    run = out.split("run directory: ")[1].split()[0]
    assert run.startswith("runs/digits-")
    summary = json.loads((tmp_path / run / "summary.json").read_text())
    assert summary["strategy"] == "mirrored" and summary["num_replicas"] == 2
    # Each replica holds a whole copy: per device is what one device holds.
    assert summary["memory"]["weights_bytes_per_device"] == 4 * summary["parameters"]

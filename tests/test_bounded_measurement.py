"""`--steps=N` of `tftrain evaluate`, `prune` and `quantize`: each model measured on the same
first N batches of the split, the examples counted (not N x batch size), the bound reported.

No model is trained for these questions: the run below holds an MLP exported as initialized
(the counts and which batches were read are the questions, not the accuracy), next to the
params.yaml of the digits config that `prune` and `quantize` read.
"""
import json

import numpy as np
import pytest

from tests.conftest import run_cli

HIDDEN = "model.params={hidden_units: [32]}"


@pytest.fixture(scope="module")
def run(tmp_path_factory, digits_dir):
    """A run directory (params.yaml, export/) of an untrained MLP on the session's digits."""
    from tftrain import config as config_lib
    from tftrain import models, tasks
    from tftrain.engine import train

    path = tmp_path_factory.mktemp("bounded_measurement") / "run"
    config = config_lib.build_config(
        "digits", overrides=f"data.dir={digits_dir},model.name=mlp,{HIDDEN},"
                            "runtime.strategy=one_device")
    config, _ = tasks.resolve(config, manifest(digits_dir))
    path.mkdir(parents=True)
    (path / "params.yaml").write_text(config_lib.to_yaml(config))
    model = models.build_model("mlp", {"hidden_units": [32]}, (8, 8, 1), 10)
    train.export(model, str(path / "export"))
    return path


def manifest(digits_dir) -> dict:
    with open(f"{digits_dir}/dataset.json") as f:
        return json.load(f)


def first_batches(digits_dir, batches, batch_size=32):
    """The test split's first `batches` batches, as the commands read them."""
    from tftrain.data import load

    return load(digits_dir, "test", batch_size, training=False).take(batches)


def keras_accuracy(run, dataset) -> float:
    """The accuracy of the run's exported model on `dataset`, computed here."""
    import tf_keras as keras

    model = keras.models.load_model(str(run / "export"), compile=False)
    right = total = 0
    for inputs, labels in dataset:
        right += int(np.sum(np.argmax(model(inputs, training=False), axis=-1) == labels.numpy()))
        total += len(labels)
    return right / total


def test_evaluate_counts_the_examples_of_the_batches_it_read(run, digits_dir, capsys, tmp_path):
    whole = manifest(digits_dir)["splits"]["test"]["num_examples"]
    assert whole % 32 and whole > 100  # the last batch of 32 is short: counting shows
    model, data = f"--model={run / 'export'}", f"--data={digits_dir}"

    assert run_cli("evaluate", model, data, "--batch_size=32", "--steps=2",
                   f"--output={tmp_path / 'two.json'}") == 0
    two = json.loads((tmp_path / "two.json").read_text())
    assert (two["num_examples"], two["steps"]) == (64, 2)
    assert two["accuracy"] == pytest.approx(keras_accuracy(run, first_batches(digits_dir, 2)),
                                            abs=1e-6)  # the first 2 batches, not any 64
    assert "examples: 64, steps: 2 (the split's first 2 batches)" in capsys.readouterr().out

    # 2 batches of 100 are the whole split: its examples, not 2 x 100.
    assert run_cli("evaluate", model, data, "--batch_size=100", "--steps=2",
                   f"--output={tmp_path / 'short.json'}") == 0
    short = json.loads((tmp_path / "short.json").read_text())
    assert (short["num_examples"], short["steps"]) == (whole, 2)
    capsys.readouterr()

    assert run_cli("evaluate", model, data, "--batch_size=32",
                   f"--output={tmp_path / 'all.json'}") == 0
    everything = json.loads((tmp_path / "all.json").read_text())
    assert (everything["num_examples"], everything["steps"]) == (whole, 0)
    assert f"examples: {whole} (the whole split)" in capsys.readouterr().out
    assert everything["accuracy"] == pytest.approx(short["accuracy"], abs=1e-6)


@pytest.mark.parametrize("command", ["evaluate", "prune", "quantize"])
def test_negative_steps_is_one_line_and_exit_2(command, run, digits_dir, capsys):
    args = {"evaluate": [f"--model={run / 'export'}", f"--data={digits_dir}"],
            "prune": [f"--model_dir={run}"],
            "quantize": [f"--model_dir={run}", "--mode=dynamic"]}[command]
    assert run_cli(command, *args, "--steps=-1") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--steps=-1" in err and "Traceback" not in err, err
    assert not (run / "pruned").exists() and not (run / "quantized").exists()


def test_the_python_api_refuses_a_negative_bound(run, digits_dir, tmp_path):
    from tftrain.errors import ConfigError
    from tftrain.optimize import evaluate, runs

    for call in (lambda: evaluate.evaluate(str(run / "export"), digits_dir, "test",
                                           output=str(tmp_path / "m.json"), steps=-3),
                 lambda: runs.quantize_run(str(run), ["dynamic"], eval_steps=-3),
                 lambda: runs.prune_run(str(run), eval_steps=-3)):
        with pytest.raises(ConfigError, match=r"--steps=-3 must be >= 0"):
            call()
    assert not (tmp_path / "m.json").exists() and not (run / "pruned").exists()


def test_quantize_measures_float_and_quantized_on_the_same_bounded_batches(run, digits_dir,
                                                                            capsys):
    from tftrain.optimize import tflite_eval

    assert run_cli("quantize", f"--model_dir={run}", "--mode=dynamic", "--steps=2",
                   "--max_accuracy_drop=1") == 0
    report = json.loads((run / "quantized" / "report_dynamic.json").read_text())
    assert report["reference"] == "tflite"  # the float .tflite fits: it is the reference
    assert (report["num_examples"], report["float_num_examples"], report["eval_steps"]) == (
        64, 64, 2)
    # Both numbers of the gate come from those 2 batches: the float .tflite scores exactly
    # what it scores on them here.
    on_them = tflite_eval.evaluate_tflite(report["float_tflite_path"],
                                          first_batches(digits_dir, 2))
    assert report["float_accuracy"] == pytest.approx(on_them["accuracy"], abs=1e-9)
    assert report["accuracy_drop"] == pytest.approx(
        report["float_accuracy"] - report["accuracy"], abs=1e-9)
    out = capsys.readouterr().out
    assert "examples: 64, steps: 2 (the split's first 2 batches)" in out
    assert "examples measured: 64 per model" in out


def test_prune_measures_every_model_on_the_same_bounded_batches(run, digits_dir, capsys):
    assert run_cli("prune", f"--model_dir={run}", "--steps=2", "--epochs=1",
                   "--target_sparsity=0.5", "--min_weights_to_prune=0") == 0
    report = json.loads((run / "pruned" / "report.json").read_text())
    assert report["eval_steps"] == 2
    assert (report["num_examples_before"], report["num_examples_after"],
            report["float_tflite"]["num_examples"], report["tflite"]["num_examples"]) == (
        64, 64, 64, 64)
    assert report["accuracy_before"] == pytest.approx(
        keras_accuracy(run, first_batches(digits_dir, 2)), abs=1e-6)
    out = capsys.readouterr().out
    assert "examples: 64, steps: 2 (the split's first 2 batches)" in out
    assert "examples measured: 64 per model" in out


def test_doctor_shares_the_steps_flag_and_refuses_zero(capsys):
    """One --steps for every command (absl has one flag namespace per process): doctor times
    at least one step, so 0 is refused in one line, before TensorFlow is used."""
    assert run_cli("doctor", "--config=digits", "--steps=0") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--steps=0" in err and "at least 1" in err, err


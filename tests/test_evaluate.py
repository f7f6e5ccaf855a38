"""`tftrain evaluate` on SavedModels: metrics printed and written as JSON, clear errors."""
import json

import numpy as np
import pytest
import tf_keras as keras

from tftrain import models
from tftrain.engine import train
from tftrain.data import load


@pytest.fixture(scope="module")
def exported(tmp_path_factory, digits_dir):
    """A small model trained for a moment and exported the way `tftrain train` exports it."""
    keras.utils.set_random_seed(0)
    model = models.build_model("mlp", {"hidden_units": [32]}, (8, 8, 1), 10)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(load(digits_dir, "train", 32, training=True), epochs=3, verbose=0)
    path = tmp_path_factory.mktemp("run") / "export"
    train.export(model, str(path))
    expected = model.evaluate(load(digits_dir, "test", 64, training=False), return_dict=True, verbose=0)
    return path, expected


def test_evaluate_prints_and_writes_metrics(cli, capsys, digits_dir, exported, tmp_path):
    path, expected = exported
    output = tmp_path / "metrics.json"
    assert cli("evaluate", f"--model={path}", f"--data={digits_dir}", "--split=test",
               f"--output={output}") == 0
    printed = capsys.readouterr().out
    assert "accuracy=" in printed and "loss=" in printed
    metrics = json.loads(output.read_text())
    assert metrics["split"] == "test" and metrics["model"] == str(path)
    np.testing.assert_allclose(metrics["accuracy"], expected["accuracy"], atol=1e-6)
    np.testing.assert_allclose(metrics["loss"], expected["loss"], rtol=1e-5)
    assert metrics["accuracy"] > 0.5


def test_default_output_is_next_to_the_model(cli, digits_dir, exported):
    path, _ = exported
    assert cli("evaluate", f"--model={path}", f"--data={digits_dir}", "--split=validation") == 0
    assert json.loads((path.parent / "eval_validation.json").read_text())["split"] == "validation"


def test_not_a_saved_model(cli, capsys, digits_dir, tmp_path):
    assert cli("evaluate", f"--model={tmp_path}", f"--data={digits_dir}") == 1
    assert "is not a SavedModel directory" in capsys.readouterr().err


def test_unknown_split_and_missing_flags(cli, capsys, digits_dir, exported):
    path, _ = exported
    assert cli("evaluate", f"--model={path}", f"--data={digits_dir}", "--split=nope") == 1
    assert "has no split 'nope'" in capsys.readouterr().err
    assert cli("evaluate", f"--data={digits_dir}") == 2
    assert "--model" in capsys.readouterr().err


def test_batches_are_the_runs_unless_given(cli, digits_dir, exported, tmp_path, capsys):
    """A run's model is evaluated in batches of the run's data.batch_size (a large model's
    bounded evaluation fits as its training steps did: lm_1b's `--steps=1` read 174 windows at
    once at the old default), a model from elsewhere in 256s, --batch_size over both."""
    import shutil

    path, _ = exported
    run = tmp_path / "run"
    shutil.copytree(path, run / "export")
    (run / "params.yaml").write_text("data:\n  batch_size: 8\ntask:\n  type: classification\n")
    for model, given, batch in ((run / "export", [], 8), (path, [], 256),
                                (run / "export", ["--batch_size=16"], 16)):
        output = tmp_path / f"{batch}.json"
        assert cli("evaluate", f"--model={model}", f"--data={digits_dir}", "--steps=1",
                   f"--output={output}", *given) == 0
        measured = json.loads(output.read_text())
        whole = 189  # the digits test split: 256 holds it all
        assert (measured["batch_size"], measured["num_examples"]) == (batch, min(batch, whole))
    for bad in ("0", "-4"):  # not a size: refused in one line, before any work
        assert cli("evaluate", f"--model={run / 'export'}", f"--data={digits_dir}",
                   f"--batch_size={bad}", f"--output={tmp_path / 'bad.json'}") == 2
        assert f"--batch_size={bad} must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "bad.json").exists()

"""Datasets and models from elsewhere run no Python in tftrain's process, and evaluate keeps the
user's files (issue #23, defects 3, 4 and 6)."""
from __future__ import annotations

import json
import pathlib
import shutil

import pytest
import tf_keras as keras

from tests.test_output_ownership import one_error_line
from tftrain.engine import export, model_code, train
from tftrain.errors import TftrainError

RAN = "lambda_code_ran.txt"


@pytest.fixture(scope="module")
def lambda_model(tmp_path_factory):
    """A digits classifier whose Lambda layer writes a file when its Python code runs, saved
    as `tftrain train` exports; and the path of that file."""
    root = tmp_path_factory.mktemp("lambda")
    sentinel = str(root / RAN)

    inputs = keras.Input((8, 8, 1))  # the Lambda's code touches `sentinel`: proof that it ran
    hidden = keras.layers.Lambda(lambda x: [open(sentinel, "w").close(), x][1],  # noqa: SIM115
                                 name="hostile")(inputs)
    outputs = keras.layers.Dense(10)(keras.layers.Flatten()(hidden))
    model = keras.Model(inputs, outputs)
    path = root / "run" / "export"
    train.export(model, str(path))
    (root / RAN).unlink(missing_ok=True)  # saving traced the layer
    return path, root / RAN


def test_evaluate_refuses_a_model_with_python_and_runs_none_of_it(lambda_model, digits_dir, cli,
                                                                   capsys, tmp_path):
    path, ran = lambda_model
    assert cli("evaluate", f"--model={path}", f"--data={digits_dir}",
               f"--output={tmp_path / 'm.json'}") == 1
    line = one_error_line(capsys.readouterr().err)
    assert "carries Python code (Lambda layer(s) hostile)" in line
    assert model_code.ALLOW_FLAG in line
    assert not ran.exists()
    assert not (tmp_path / "m.json").exists()
    # The user who trusts it says so, and the code runs.
    assert cli("evaluate", f"--model={path}", f"--data={digits_dir}", "--allow_python_in_model",
               f"--output={tmp_path / 'm.json'}") == 0
    assert ran.exists()


def test_the_python_check_reads_h5_configs_too(tmp_path):
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Lambda(lambda x: x + 1, name="plus_one")(inputs))
    model.save(str(tmp_path / "m.h5"))
    assert model_code.python_layers(str(tmp_path / "m.h5")) == ["plus_one"]
    with pytest.raises(TftrainError, match="--allow_python_in_model"):
        model_code.refuse_python(str(tmp_path / "m.h5"), allow=False)


@pytest.mark.parametrize("damage", [b"", b"\x00garbage\xff" * 100, None])
def test_a_damaged_saved_model_is_one_line(damage, lambda_model, digits_dir, cli, capsys,
                                           tmp_path):
    path, _ = lambda_model
    copy = tmp_path / "export"
    shutil.copytree(path, copy)
    target = pathlib.Path(export.saved_model_dir(str(copy))) / ("saved_model.pb" if damage is not None else "keras_metadata.pb")
    target.write_bytes(damage if damage is not None else b"\x0a\xff\xff\xff\xff\x0f")
    code = cli("evaluate", f"--model={copy}", f"--data={digits_dir}",
               f"--output={tmp_path / 'm.json'}", "--allow_python_in_model"
               if damage is not None else "--split=test")
    assert code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = one_error_line(err)
    assert "cannot load the SavedModel" in line or "is not a readable Keras metadata" in line


def test_evaluate_keeps_a_file_it_did_not_write(lambda_model, digits_dir, cli, capsys, tmp_path):
    run = tmp_path / "run"
    exported = run / "export"
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Flatten()(inputs)))
    train.export(model, str(exported))
    (run / "eval_test.json").write_text("my own notes")
    assert cli("evaluate", f"--model={exported}", f"--data={digits_dir}") == 1
    assert "was not written by tftrain evaluate" in one_error_line(capsys.readouterr().err)
    assert (run / "eval_test.json").read_text() == "my own notes"
    (run / "eval_test.json").unlink()
    assert cli("evaluate", f"--model={exported}", f"--data={digits_dir}") == 0
    assert cli("evaluate", f"--model={exported}", f"--data={digits_dir}") == 0  # its own: replaced
    assert json.loads((run / "eval_test.json").read_text())["written_by"] == "tftrain evaluate"


def test_a_dataset_cannot_choose_the_module_tftrain_imports(digits_dir, tmp_path, cli, capsys):
    data = tmp_path / "digits"
    shutil.copytree(digits_dir, data)
    manifest = json.loads((data / "dataset.json").read_text())
    manifest["pipeline"] = "this.x"  # importing `this` prints the Zen of Python: code ran
    (data / "dataset.json").write_text(json.dumps(manifest))
    code = cli("train", f"--model_dir={tmp_path / 'run'}",
               f"--params_override=data.dir={data},train.epochs=1,model.name=mlp,"
               "model.params={hidden_units: [16]}")
    captured = capsys.readouterr()
    assert code == 1
    assert "The Zen of Python" not in captured.out
    line = one_error_line(captured.err)
    assert "names the pipeline 'this.x', which is not built in" in line
    assert "data.pipeline: this.x" in line

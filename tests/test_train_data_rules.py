"""What `tftrain train` reads and converts: never someone else's files, never digits in place
of the data the user pointed at; TFRecords other tools wrote are read as they are when the
config names their pipeline (`data.format=tfrecord`), by train, evaluate, prune and quantize."""
import hashlib
import json
import os

import numpy as np
import pytest

from pipelines.images import png_example

FOREIGN_TRAIN_SHARDS = 8


def _listing(path):
    return {name: hashlib.sha256((path / name).read_bytes()).hexdigest()
            for name in sorted(os.listdir(path))}


@pytest.fixture(scope="module")
def foreign_dir(tmp_path_factory):
    """Digits as another tool writes them: standard image keys, eight `train-*` shards (the
    layout of the reported data loss), no dataset.json."""
    import tensorflow as tf
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.clip(np.rint(digits.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    path = tmp_path_factory.mktemp("foreign")
    splits = {"train": range(0, 1400), "validation": range(1400, 1600), "test": range(1600, 1797)}
    for split, indices in splits.items():
        shards = FOREIGN_TRAIN_SHARDS if split == "train" else 1
        for shard in range(shards):
            name = f"{split}-{shard:05d}-of-{shards:05d}.tfrecord"
            with tf.io.TFRecordWriter(str(path / name)) as writer:
                for i in list(indices)[shard::shards]:
                    writer.write(png_example(images[i], label=int(digits.target[i]),
                                             text=str(digits.target[i]), filename=f"d/{i}"))
    return path


def test_train_refuses_a_directory_of_foreign_shards_and_touches_nothing(cli, capsys, foreign_dir,
                                                                          tmp_path):
    before = _listing(foreign_dir)
    code = cli("train", f"--params_override=data.dir={foreign_dir},train.epochs=1",
               f"--model_dir={tmp_path / 'run'}")
    err = capsys.readouterr().err
    assert code == 1
    line = [x for x in err.splitlines() if x.startswith("tftrain train: error:")]
    assert len(line) == 1 and "Traceback" not in err
    assert "did not write" in line[0] and "data.format=tfrecord" in line[0]
    assert f"{len(before)} file(s)" in line[0]
    assert _listing(foreign_dir) == before  # no shard deleted, nothing added


def test_foreign_tfrecords_train_evaluate_prune_and_quantize_in_place(cli, capsys, foreign_dir,
                                                                       tmp_path):
    before = _listing(foreign_dir)
    run = tmp_path / "run"
    # A small MLP (the questions are about the files, not the model): train, prune and
    # quantize cost ~3/4 of the CPU of the digits CNN.
    assert cli("train", f"--model_dir={run}", "--params_override=data.format=tfrecord,"
               f"data.dir={foreign_dir},data.pipeline=digits,data.info={{num_classes: 10}},"
               "model.name=mlp,model.params={hidden_units: [64]},train.learning_rate=0.01,"
               "train.epochs=4") == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["data_dir"] == str(foreign_dir) and summary["epochs"] == 4
    # images and labels read as written: 0.904 measured (4 epochs of 43 steps), chance 0.1
    assert summary["eval"]["accuracy"] > 0.8
    assert cli("evaluate", f"--model={run}/export", f"--data={foreign_dir}", "--pipeline=digits",
               "--split=test", f"--output={tmp_path / 'eval.json'}") == 0
    evaluated = json.loads((tmp_path / "eval.json").read_text())
    np.testing.assert_allclose(evaluated["accuracy"], summary["eval"]["accuracy"], atol=1e-6)
    assert cli("prune", f"--model_dir={run}", "--epochs=1", "--min_weights_to_prune=0") == 0
    assert cli("quantize", f"--model_dir={run}", "--mode=dynamic") == 0
    assert json.loads((run / "quantized" / "report.json").read_text())["mode"] == "dynamic"
    capsys.readouterr()
    assert _listing(foreign_dir) == before  # read in place: nothing written beside the files


def test_foreign_tfrecords_need_their_number_of_classes(cli, capsys, foreign_dir, tmp_path):
    code = cli("train", f"--model_dir={tmp_path / 'run'}", "--params_override=data.format=tfrecord,"
               f"data.dir={foreign_dir},data.pipeline=digits,train.epochs=1")
    assert code == 1
    assert "data.info={num_classes: K}" in capsys.readouterr().err


def test_a_command_line_data_dir_is_not_filled_with_the_embedded_digits(cli, capsys, tmp_path):
    mine = tmp_path / "my_dataset"  # e.g. a mistyped path to the user's own data
    code = cli("train", f"--params_override=data.dir={mine},train.epochs=1",
               f"--model_dir={tmp_path / 'run'}")
    err = capsys.readouterr().err
    assert code == 1 and "holds no tftrain dataset" in err and "data.pipeline=digits" in err
    assert not (mine / "dataset.json").exists()
    # Said explicitly, the digits data is converted there and trained on.
    assert cli("train", f"--params_override=data.dir={mine},data.pipeline=digits,train.epochs=1",
               f"--model_dir={tmp_path / 'run2'}") == 0
    assert json.loads((mine / "dataset.json").read_text())["pipeline"] == "digits"


def test_a_float_label_classified_is_one_clear_error_not_a_traceback(cli, capsys, tmp_path):
    """A float label is a regression target (tests/test_regression.py trains one); asking for a
    classifier of it is one clear line."""
    table = tmp_path / "table.csv"
    rng = np.random.default_rng(0)
    rows = ["a,b,y"] + [f"{a:.3f},{b:.3f},{a * 2 + b:.3f}" for a, b in rng.normal(size=(200, 2))]
    table.write_text("\n".join(rows) + "\n")
    data = tmp_path / "table"
    assert cli("convert", "--pipeline=csv", f"--input={table}", f"--output={data}",
               "--pipeline_options=columns=a:float,b:float,y:float,label_column=y",
               "--splits=train:0.8,validation:0.1,test:0.1", "--workers=1") == 0
    capsys.readouterr()
    code = cli("train", f"--params_override=data.dir={data},model.name=mlp,model.params={{}},"
               "train.epochs=1,task.type=classification", f"--model_dir={tmp_path / 'run'}")
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and "KeyError" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert "needs integer class labels" in err and "task.type=regression" in err


def test_evaluate_on_data_that_does_not_fit_the_model_is_one_line(cli, capsys, tmp_path,
                                                                  digits_dir):
    from tftrain import models
    from tftrain.engine import train

    model = models.build_model("mlp", {"hidden_units": [8]}, (8, 8, 1), 10)
    train.export(model, str(tmp_path / "export"))
    table = tmp_path / "t.csv"
    table.write_text("a,b,label\n" + "".join(f"{i % 7}.5,{i % 3}.25,{i % 2}\n" for i in range(60)))
    assert cli("convert", "--pipeline=csv", f"--input={table}", f"--output={tmp_path / 'csv'}",
               "--splits=test:1.0", "--workers=1") == 0
    capsys.readouterr()
    code = cli("evaluate", f"--model={tmp_path / 'export'}", f"--data={tmp_path / 'csv'}")
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("tftrain evaluate: error:")]
    assert "(None, 8, 8, 1)" in line and "(None, 2)" in line

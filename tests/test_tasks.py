"""Tasks: which one a dataset's label implies, clear errors for the ones it cannot support,
their metrics checked against numpy/scikit-learn/Keras, builders given the task's outputs, and
params.yaml of runs from before tasks."""
import logging

import numpy as np
import pytest
import tf_keras as keras
import yaml

from tests.conftest import run_cli
from tftrain import config as config_lib
from tftrain import models, tasks
from tftrain.data import manifest as manifest_lib
from tftrain.errors import ConfigError, DataError
from tftrain.tasks import registry
from tftrain.tasks.classification import ClassificationTask, cross_entropy
from tftrain.tasks.regression import RegressionTask, huber, regression_metrics


def _config(**task) -> config_lib.Config:
    config = config_lib.Config()
    config.model.name = "mlp"
    for key, value in task.items():
        setattr(config.task, key, value)
    return config


def _convert_csv(cli, tmp_path, labels, columns=""):
    tmp_path.mkdir()
    source = tmp_path / "t.csv"
    rng = np.random.default_rng(0)
    source.write_text("a,label\n" + "".join(f"{rng.normal():.3f},{v}\n" for v in labels))
    output = tmp_path / "data"
    options = [f"--pipeline_options=columns={columns}"] if columns else []
    assert cli("convert", "--pipeline=csv", f"--input={source}", f"--output={output}",
               "--workers=1", *options) == 0
    return manifest_lib.read(str(output))


def test_inference_from_what_the_converter_recorded(cli, tmp_path, caplog, digits_dir):
    # Few whole numbers: class ids. Text: class names. A float: regression.
    few = _convert_csv(cli, tmp_path / "few", [i % 3 for i in range(60)])
    assert few["info"]["label_stats"]["distinct"] == 3
    assert registry.infer_type(few) == "classification"
    names = _convert_csv(cli, tmp_path / "names", ["cat", "dog"] * 30)
    assert registry.infer_type(names) == "classification"
    floats = _convert_csv(cli, tmp_path / "floats", [f"{i / 7:.3f}" for i in range(60)],
                          columns="label:float")
    assert registry.infer_type(floats) == "regression"
    assert registry.infer_type(manifest_lib.read(digits_dir)) == "classification"
    # Hundreds of distinct whole numbers (a count, a price, the diabetes target): a quantity,
    # inferred as regression with a warning that says how to choose.
    many = _convert_csv(cli, tmp_path / "many", [25 + (i * 37) % 300 for i in range(400)])
    assert many["info"]["label_stats"]["distinct"] == 300
    assert many["info"]["num_classes"] == 325  # still what classification would use
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        resolved, task = tasks.resolve(_config(), many)
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "300 distinct values" in warning
    assert "task.type=regression" in warning and "task.type=classification" in warning
    assert task.name == "regression" and resolved.task.type == "regression"
    assert resolved.train.monitor == "val_rmse" and resolved.task.loss == "mse"
    # Said explicitly, no warning, and classification is what was asked.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        resolved, task = tasks.resolve(_config(type="classification"), many)
    assert not caplog.records and task.outputs().size == 325
    assert resolved.train.monitor == "val_accuracy"


def test_numpy_targets_record_their_statistics(cli, tmp_path):
    rng = np.random.default_rng(1)
    y = rng.normal(loc=[10.0, -3.0], scale=[2.0, 0.5], size=(80, 2)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=rng.normal(size=(80, 4)).astype(np.float32), y=y)
    assert cli("convert", "--pipeline=numpy", f"--input={tmp_path / 'd.npz'}",
               f"--output={tmp_path / 'data'}", "--workers=1") == 0
    manifest = manifest_lib.read(str(tmp_path / "data"))
    stats = manifest["info"]["label_stats"]
    np.testing.assert_allclose(stats["mean"], y.astype(np.float64).mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(stats["std"], y.astype(np.float64).std(axis=0), rtol=1e-5)
    _, task = tasks.resolve(_config(), manifest)
    assert task.name == "regression"
    spec = task.outputs()
    assert spec.size == 2 and spec.kind == "values"
    np.testing.assert_allclose(spec.std, stats["std"])


def test_tasks_the_labels_cannot_support_are_one_clear_error(cli, capsys, tmp_path, digits_dir):
    digits = manifest_lib.read(digits_dir)
    with pytest.raises(DataError, match="task.type=regression needs a numeric label"):
        tasks.from_config(_config(type="regression"), digits)
    floats = {"pipeline": "csv", "info": {"label": {"type": "float"},
                                          "label_stats": {"kind": "float", "shape": []}}}
    with pytest.raises(DataError, match="classification needs integer class labels.*"
                                        "task.type=regression"):
        tasks.from_config(_config(type="classification"), floats)
    with pytest.raises(DataError, match="task.type=language_model needs"):
        tasks.from_config(_config(type="language_model"), {"info": {"num_classes": 10}})
    with pytest.raises(ConfigError, match="did you mean 'regression'"):
        config_lib.build_config("digits", overrides="task.type=regresion")
    with pytest.raises(ConfigError, match="task.loss='huber' \\(a regression loss\\)"):
        config_lib.build_config("digits", overrides="task.type=classification,task.loss=huber")
    with pytest.raises(ConfigError, match="train.monitor=val_accuracy is not a metric of the "
                                          "regression task.*val_rmse"):
        config_lib.build_config("digits", overrides="task.type=regression,"
                                                    "train.monitor=val_accuracy")
    # On the command line: one line, exit 1, before anything is trained.
    code = run_cli("train", f"--model_dir={tmp_path / 'run'}",
                   f"--params_override=data.dir={digits_dir},task.type=regression")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "needs a numeric label" in err[0], err


def test_regression_metrics_match_scikit_learn_and_keras():
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    rng = np.random.default_rng(2)
    truth = rng.normal(100, 30, size=(97, 3))
    predicted = truth + rng.normal(0, 10, size=truth.shape)
    got = regression_metrics(predicted, truth)
    assert got["mse"] == pytest.approx(mean_squared_error(truth, predicted), rel=1e-12)
    assert got["rmse"] == pytest.approx(np.sqrt(mean_squared_error(truth, predicted)), rel=1e-12)
    assert got["mae"] == pytest.approx(mean_absolute_error(truth, predicted), rel=1e-12)
    assert got["r2"] == pytest.approx(r2_score(truth, predicted), rel=1e-12)
    # A scalar label against a one-unit output is the same thing.
    one = regression_metrics(predicted[:, :1], truth[:, 0])
    assert one["r2"] == pytest.approx(r2_score(truth[:, 0], predicted[:, 0]), rel=1e-12)
    errors = predicted - truth
    expected_huber = keras.losses.Huber(delta=8.0)(truth, predicted).numpy()
    assert huber(errors, 8.0) == pytest.approx(float(expected_huber), rel=1e-5)

    # The streaming Keras metrics of training, over uneven batches, agree with `evaluate`.
    task = RegressionTask({}, "huber", shape=(3,), mean=[100] * 3, std=[30] * 3)
    compiled = {m.name if hasattr(m, "name") else m: m for m in task.metrics()}
    for start in range(0, 97, 40):
        for metric in compiled.values():
            metric.update_state(truth[start:start + 40].astype(np.float32),
                                predicted[start:start + 40].astype(np.float32))
    evaluated = task.evaluate(predicted, truth)
    for name, metric in compiled.items():
        assert float(metric.result()) == pytest.approx(evaluated[name], rel=1e-4), name
    assert evaluated["loss"] == pytest.approx(huber(errors, 30.0))
    assert task.change(10.0, 10.5) == pytest.approx(0.05)  # the quantize gate: relative RMSE


def test_classification_metrics_match_keras():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(50, 4)).astype(np.float32)
    labels = rng.integers(0, 4, size=50)
    task = ClassificationTask({}, num_classes=4)
    result = task.evaluate(logits, labels)
    expected = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
    assert result["loss"] == pytest.approx(float(expected), rel=1e-5)
    assert cross_entropy(logits, labels) == result["loss"]
    assert result["accuracy"] == (logits.argmax(1) == labels).mean()
    assert task.change(0.95, 0.94) == pytest.approx(0.01)  # the accuracy drop, in points / 100
    assert task.mode("val_loss") == "min" and task.mode("auto") == "max"
    assert RegressionTask.mode("val_r2") == "max" and RegressionTask.mode("auto") == "min"


def test_builders_get_the_task_outputs_and_old_builders_still_work():
    spec = RegressionTask({}, shape=(), mean=150.0, std=70.0).outputs()
    model = models.build_model("mlp", {"hidden_units": [4]}, (5,), spec)
    x = np.random.default_rng(4).normal(size=(6, 5)).astype(np.float32)
    standardized = keras.Model(model.input, model.get_layer("standardized").output)
    np.testing.assert_allclose(model(x).numpy(), standardized(x).numpy() * 70.0 + 150.0,
                               rtol=1e-5)
    # A user's builder of (input_shape, num_classes, **params) gets the number of outputs.
    user = models.build_model("tests.user_model:tiny", {"units": 4}, (5,), spec)
    assert user.output_shape == (None, 1)
    classes = models.build_model("tests.user_model:tiny", {"units": 4}, (5,), 7)
    assert classes.output_shape == (None, 7)
    assert models.build_model("cnn", {"filters": [4]}, (8, 8, 1), 10).output_shape == (None, 10)


def test_params_yaml_without_a_task_section_means_classification(tmp_path):
    params = config_lib.to_dict(config_lib.build_config("digits"))
    del params["task"]  # written by a tftrain without tasks
    params["train"]["monitor"] = "val_accuracy"
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    old = config_lib.from_yaml_file(str(path))
    assert old.task.type == "classification" and old.task.loss == "auto"
    new = config_lib.build_config("digits")
    assert new.task.type == "auto" and new.train.monitor == "auto"  # resolved per run
    # `tftrain evaluate` on a model of such a run scores it as a classifier.
    from tftrain.engine import run_config

    (tmp_path / "export" / "1").mkdir(parents=True)
    assert run_config.run_of(str(tmp_path / "export" / "1")) == str(tmp_path)
    assert run_config.run_of(str(tmp_path / "elsewhere" / "model")) is None

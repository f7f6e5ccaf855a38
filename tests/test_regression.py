"""Regression end to end: a CSV float label and the embedded diabetes data, trained, evaluated
(SavedModel and .tflite), quantized under the RMSE gate, and compared with scikit-learn's Ridge
on the splits the converter wrote."""
import json
import math

import numpy as np
import pytest
import yaml

from tests import documented
from tests.conftest import run_cli
from tftrain.data import load


def _rows(n: int, seed: int = 0) -> list[str]:
    """A table whose float target is a noisy, slightly non-linear function of 3 columns."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    y = 50 + 20 * x[:, 0] - 10 * x[:, 1] + 5 * x[:, 2] ** 2 + rng.normal(scale=2.0, size=n)
    return ["a,b,c,y"] + [f"{a:.4f},{b:.4f},{c:.4f},{t:.4f}" for (a, b, c), t in zip(x, y)]


def _arrays(data_dir: str, split: str):
    """Every (inputs, label) of a split, as the trainer reads them from the TFRecords."""
    pairs = [(x.numpy(), y.numpy()) for x, y in load(data_dir, split, 512, training=False)]
    return np.concatenate([x for x, _ in pairs]), np.concatenate([y for _, y in pairs])


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("regression")
    (root / "table.csv").write_text("\n".join(_rows(400)) + "\n")
    data, run = root / "table", root / "run"
    assert run_cli("convert", "--pipeline=csv", f"--input={root / 'table.csv'}",
                   f"--output={data}", "--pipeline_options=columns=y:float,label_column=y",
                   "--workers=1") == 0
    assert run_cli("train", f"--model_dir={run}", "--params_override="
                   f"data.dir={data},data.pipeline=csv,model.name=mlp,"
                   "model.params={hidden_units: [32], dropout: 0.0},train.epochs=3,"
                   "train.steps_per_epoch=60,train.learning_rate=0.01,"
                   "train.lr_schedule=cosine,data.batch_size=32") == 0
    return data, run


def test_a_float_csv_label_trains_as_regression(csv_run):
    data, run = csv_run
    summary = json.loads((run / "summary.json").read_text())
    params = yaml.safe_load((run / "params.yaml").read_text())
    assert summary["task"] == {"type": "regression", "loss": "mse", "label_smoothing": 0.0}
    assert params["task"] == {"type": "regression", "loss": "mse", "label_smoothing": 0.0}
    assert params["train"]["monitor"] == "val_rmse"
    assert set(summary["eval"]) >= {"loss", "rmse", "mae", "r2"} and "accuracy" not in summary["eval"]
    # Learned: the target's standard deviation is ~23; predicting the mean scores R² = 0.
    assert summary["eval"]["r2"] > 0.8 and summary["eval"]["rmse"] < 10, summary["eval"]
    assert math.isclose(summary["eval"]["rmse"] ** 2, summary["eval"]["loss"], rel_tol=1e-4)


def test_evaluate_scores_the_saved_model_and_tflite_with_the_task_metrics(csv_run, tmp_path):
    data, run = csv_run
    summary = json.loads((run / "summary.json").read_text())
    output = tmp_path / "eval.json"
    assert run_cli("evaluate", f"--model={run / 'export'}", f"--data={data}", "--split=test",
                   f"--output={output}") == 0
    evaluated = json.loads(output.read_text())
    assert evaluated["task"] == "regression"
    for key in ("rmse", "mae", "r2", "loss"):  # numpy on the predictions == Keras's metrics
        assert evaluated[key] == pytest.approx(summary["eval"][key], rel=1e-4), key

    # The same numbers from the predictions, computed here with scikit-learn.
    import tf_keras as keras
    from sklearn.metrics import mean_absolute_error, r2_score

    from tftrain.engine.export import saved_model_dir

    model = keras.models.load_model(saved_model_dir(str(run / "export")), compile=False)
    x, y = _arrays(str(data), "test")
    predicted = model.predict(x, verbose=0)[:, 0]
    assert evaluated["rmse"] == pytest.approx(np.sqrt(np.mean((predicted - y) ** 2)), rel=1e-4)
    assert evaluated["mae"] == pytest.approx(mean_absolute_error(y, predicted), rel=1e-4)
    assert evaluated["r2"] == pytest.approx(r2_score(y, predicted), rel=1e-4)

    # Quantized under the RMSE gate, then the .tflite file evaluated on its own.
    assert run_cli("quantize", f"--model_dir={run}", "--mode=dynamic",
                   "--max_metric_change=0.05") == 0
    report = json.loads((run / "quantized" / "report_dynamic.json").read_text())
    assert report["measure"] == "rmse" and report["passed"]
    assert report["metric_change"] == pytest.approx(
        (report["rmse"] - report["float_rmse"]) / report["float_rmse"])
    assert report["float_rmse"] == pytest.approx(evaluated["rmse"], rel=1e-3)  # float .tflite
    tflite_output = tmp_path / "tflite.json"
    assert run_cli("evaluate", f"--model={report['tflite_path']}", f"--data={data}",
                   "--split=test", f"--output={tflite_output}") == 0
    assert json.loads(tflite_output.read_text())["rmse"] == pytest.approx(report["rmse"], rel=1e-6)


def test_the_quantize_gate_is_the_relative_rmse_increase(csv_run, capsys):
    """A zero tolerance: the int8 model passes exactly when its RMSE is not above the float's."""
    _, run = csv_run
    code = run_cli("quantize", f"--model_dir={run}", "--mode=int8", "--max_metric_change=0")
    report = json.loads((run / "quantized" / "report_int8.json").read_text())
    assert report["passed"] == (report["rmse"] <= report["float_rmse"] * (1 + 1e-9))
    assert code == (0 if report["passed"] else 1)
    if not report["passed"]:
        assert "metric_change" in capsys.readouterr().err
    # --max_accuracy_drop bounds classifiers; it does not decide a regression run.
    assert run_cli("quantize", f"--model_dir={run}", "--mode=float16",
                   "--max_accuracy_drop=0") == 0


def test_mlp_on_diabetes_is_within_10_percent_of_ridge(tmp_path, capsys, monkeypatch):
    """The config's `Run:` header command as written, in a fresh directory (shortened to the
    same 660 steps in 6 longer epochs), against a Ridge regression fitted on the same train
    split and scored on the same test split; then its `Evaluate:` and `Quantize:` commands on
    the run, as written."""
    from sklearn.linear_model import Ridge

    monkeypatch.chdir(tmp_path)  # a fresh directory: data/diabetes converted on first use
    data, run = tmp_path / "data/diabetes", tmp_path / "runs/diabetes"
    assert run_cli(*documented.args("tftrain train --config=diabetes --model_dir=runs/diabetes"),
                   "--params_override=train.epochs=6,train.steps_per_epoch=110") == 0
    summary = json.loads((run / "summary.json").read_text())
    x_train, y_train = _arrays(str(data), "train")
    x_test, y_test = _arrays(str(data), "test")
    ridge = Ridge(alpha=1.0).fit(x_train, y_train)
    ridge_rmse = float(np.sqrt(np.mean((ridge.predict(x_test) - y_test) ** 2)))
    rmse = summary["eval"]["rmse"]
    with capsys.disabled():
        print(f"\ndiabetes test RMSE: mlp {rmse:.2f} (R² {summary['eval']['r2']:.3f}), "
              f"Ridge {ridge_rmse:.2f}, {len(y_test)} test / {len(y_train)} train rows")
    assert summary["task"]["type"] == "regression"
    assert rmse <= 1.10 * ridge_rmse, (rmse, ridge_rmse)
    assert run_cli(*documented.args(
        "tftrain evaluate --model=runs/diabetes/export --data=data/diabetes --split=test")) == 0
    assert json.loads((run / "eval_test.json").read_text())["rmse"] == pytest.approx(rmse,
                                                                                      rel=1e-4)
    assert run_cli(*documented.args(
        "tftrain quantize --model_dir=runs/diabetes --mode=dynamic,float16")) == 0
    for mode in ("dynamic", "float16"):  # each within the gate's relative RMSE increase
        report = json.loads((run / "quantized" / f"report_{mode}.json").read_text())
        assert report["rmse"] <= 1.05 * rmse, report

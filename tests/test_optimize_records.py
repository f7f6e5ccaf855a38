"""The typed records of pruned/report.json and quantized/report_<name>.json give the JSON keys
and values the reports always had (what `tftrain report` and the comparison table read)."""
import dataclasses
import json
import pathlib

import pytest

from tftrain.optimize import report

EVALUATED = {"loss": 0.3, "accuracy": 0.9, "latency_ms": 9.0, "latency_batch_size": 1,
             "num_threads": 1, "num_examples": 189, "tflite_bytes": 4000, "gzip_bytes": 3000}
TIMED = {"latency_ms": 1.5, "latency_batch_size": 1, "throughput_ms_per_example": 0.2,
         "throughput_batch_size": 256, "num_threads": 2, "cpu": "X CPU (avx2)"}


def _measurement(path="/run/pruned/float.tflite", accuracy=0.9, tflite_bytes=4000,
                 latency_ms=1.5, throughput=0.2):
    return report.TfliteMeasurement.of(
        path, {**EVALUATED, "accuracy": accuracy, "tflite_bytes": tflite_bytes},
        {**TIMED, "latency_ms": latency_ms, "throughput_ms_per_example": throughput})


def test_a_tflite_measurement_keeps_the_comparisons_times():
    measured = _measurement()
    assert measured.metrics == {"loss": 0.3, "accuracy": 0.9}
    # The interleaved comparison's times and threads replace the evaluation's.
    assert (measured.latency_ms, measured.num_threads) == (1.5, 2)
    assert measured.to_json() == {
        "path": "/run/pruned/float.tflite", "loss": 0.3, "accuracy": 0.9, "num_examples": 189,
        "tflite_bytes": 4000, "gzip_bytes": 3000, "latency_ms": 1.5, "latency_batch_size": 1,
        "throughput_ms_per_example": 0.2, "throughput_batch_size": 256, "num_threads": 2,
        "cpu": "X CPU (avx2)"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        measured.latency_ms = 0.0


def _keras(accuracy, sparsity, nonzero, gzip_bytes, layers):
    return report.KerasMeasurement(metrics={"loss": 0.2, "accuracy": accuracy},
                                   sparsity=sparsity, pruned_params=16, num_params=24,
                                   nonzero_params=nonzero, layers=layers, gzip_bytes=gzip_bytes)


def _prune_report(**changes):
    layers = [{"layer": "dense", "class": "Dense", "params": 24, "nonzero_params": 8,
               "weights": ["dense/kernel:0"], "weight_params": 16, "zeros": 16,
               "sparsity": 1.0}]
    fields = dict(
        source="/run/export/1", split="test", strategy="mirrored", num_replicas=2,
        target_sparsity=0.75, sparsity_m_by_n=None,
        schedule={"kind": "polynomial", "frequency": 10}, epochs=3, steps_per_epoch=100,
        learning_rate=0.001, distill_weight=0.5, distill_temperature=2.0,
        task="classification", measure="accuracy", change_name="accuracy_drop", change=0.01,
        before=_keras(0.95, 0.0, 24, 5000, []), after=_keras(0.94, 0.75, 8, 2000, layers),
        float_tflite=_measurement(), tflite=_measurement("/run/pruned/model.tflite", 0.94, 1000),
        unsupported_layers=[], min_weights_to_prune=2048, small_layers=["logits"])
    return report.PruneReport(**{**fields, **changes})


def test_the_prune_report_gives_the_keys_of_pruned_report_json():
    record = _prune_report()
    data = record.to_json()
    assert data == {
        "source": "/run/export/1", "split": "test", "strategy": "mirrored", "num_replicas": 2,
        "target_sparsity": 0.75, "sparsity_m_by_n": None,
        "schedule": {"kind": "polynomial", "frequency": 10}, "epochs": 3,
        "steps_per_epoch": 100, "learning_rate": 0.001, "distill_weight": 0.5,
        "distill_temperature": 2.0, "sparsity": 0.75, "sparsity_before": 0.0,
        "num_params": 24, "pruned_params": 16, "nonzero_params_before": 24,
        "nonzero_params_after": 8, "gzip_bytes_before": 5000, "gzip_bytes_after": 2000,
        "task": "classification", "measure": "accuracy", "accuracy_before": 0.95,
        "accuracy_after": 0.94, "accuracy_drop": 0.01,
        "metrics_before": {"loss": 0.2, "accuracy": 0.95},
        "metrics_after": {"loss": 0.2, "accuracy": 0.94}, "unsupported_layers": [],
        "min_weights_to_prune": 2048, "small_layers": ["logits"],
        "layers": record.after.layers, "float_tflite": record.float_tflite.to_json(),
        "tflite": record.tflite.to_json(), "gzip_ratio": 0.4, "problems": []}
    json.dumps(data)  # plain JSON
    # The gate's bound appears only when one was given.
    gated = _prune_report(max_metric_change=0.05, problems=("rmse 2.0 vs float 1.0",))
    assert gated.to_json()["max_metric_change"] == 0.05
    assert gated.to_json()["problems"] == ["rmse 2.0 vs float 1.0"]


def _quantize_report(mode="int8", change=0.004, throughput=0.05, **extra):
    return report.QuantizeReport(
        mode=mode, source="export", model="/run/export/1", split="test", task="classification",
        measure="accuracy", change_name="accuracy_drop", change=change, max_change=0.01,
        metrics={"loss": 0.3, "accuracy": 0.896}, float_metrics={"loss": 0.3, "accuracy": 0.9},
        tflite=_measurement(f"/run/quantized/model_{mode}.tflite", 0.896, 1000, 0.75,
                            throughput),
        float_tflite=_measurement("/run/quantized/model_float.tflite"), int8_io=False, **extra)


def test_the_quantize_report_gives_the_keys_of_report_mode_json():
    assert _quantize_report(num_calibration_examples=100).to_json() == {
        "mode": "int8", "source": "export", "model": "/run/export/1", "split": "test",
        "tflite_path": "/run/quantized/model_int8.tflite", "tflite_bytes": 1000,
        "gzip_bytes": 3000, "task": "classification", "measure": "accuracy",
        "accuracy": 0.896, "latency_ms": 0.75, "throughput_ms_per_example": 0.05,
        "latency_batch_size": 1, "throughput_batch_size": 256, "num_threads": 2,
        "cpu": "X CPU (avx2)", "num_examples": 189, "reference": "tflite",
        "float_tflite_path": "/run/quantized/model_float.tflite", "float_tflite_bytes": 4000,
        "float_gzip_bytes": 3000, "float_accuracy": 0.9, "float_latency_ms": 1.5,
        "float_throughput_ms_per_example": 0.2, "accuracy_drop": 0.004,
        "max_accuracy_drop": 0.01, "metrics": {"loss": 0.3, "accuracy": 0.896},
        "float_metrics": {"loss": 0.3, "accuracy": 0.9}, "size_ratio": 0.25,
        "latency_ratio": 0.5, "throughput_ratio": 0.25, "int8_io": False, "passed": True,
        "num_calibration_examples": 100}
    qat = _quantize_report("qat", change=0.02, throughput=None, float_layers=[], qat_epochs=1)
    data = qat.to_json()
    assert not qat.passed and data["passed"] is False
    assert data["throughput_ratio"] is None
    assert (data["float_layers"], data["qat_epochs"]) == ([], 1)
    assert "num_calibration_examples" not in data
    assert "float_layers" not in _quantize_report("float16").to_json()


def test_a_written_record_reads_back_into_the_table(tmp_path):
    record = _quantize_report(num_calibration_examples=100)
    path = report.write_quantized_report(str(tmp_path), record)
    assert path.endswith("quantized/report_int8.json")
    assert json.loads(pathlib.Path(path).read_text()) == record.to_json()
    assert json.loads((tmp_path / "quantized/report.json").read_text()) == record.to_json()
    (tmp_path / "pruned").mkdir()
    (tmp_path / "pruned/report.json").write_text(json.dumps(_prune_report().to_json()))
    rows = report.comparison_rows(str(tmp_path))
    assert [row["model"] for row in rows] == ["float", "pruned", "int8"]
    assert rows[2]["accuracy"] == 0.896 and rows[2]["float"]["accuracy"] == 0.9
    assert "| int8 | 0.8960 (-0.4 pt) |" in report.demo_table(str(tmp_path))
    # A report written as a dict (tests, older callers) is written as before.
    report.write_quantized_report(str(tmp_path), {**record.to_json(), "mode": "float16"})
    assert json.loads((tmp_path / "quantized/report.json").read_text())["mode"] == "float16"

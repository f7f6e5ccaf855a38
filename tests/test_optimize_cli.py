"""`tftrain prune`, `tftrain quantize`, `tftrain evaluate --model=X.tflite` on a real run dir.

The run is trained once, mirrored over the test process's 2 virtual CPUs, so pruning and
quantization-aware training run under the same strategy as training.
"""
import json
import os
import shutil
import socket

import numpy as np
import pytest
import tf_keras as keras

from tests.conftest import run_cli
from tests.test_output_ownership import hold_run_lock, stop
from tftrain.optimize import tflite_eval
from tftrain.engine.export import saved_model_dir

SMALL_MODEL = "model.params={filters: [16, 32], dense_units: 64, dropout: 0.0}"


@pytest.fixture(scope="module")
def run(tmp_path_factory, digits_dir):
    path = tmp_path_factory.mktemp("optimize") / "run"
    assert run_cli("train", f"--model_dir={path}", "--strategy=mirrored",
                   f"--params_override=runtime.cpu_devices=2,train.epochs=6,data.dir={digits_dir},"
                   f"{SMALL_MODEL}") == 0
    return path


def _copy_run(run, destination, with_export=True):
    destination.mkdir()
    for name in ("params.yaml", "summary.json"):
        shutil.copy(run / name, destination / name)
    if with_export:
        shutil.copytree(run / "export", destination / "export")
    return destination


def _hidden_dense(model):
    """The model registry's cnn names only its logits layer; find the hidden Dense by type."""
    (dense,) = [l for l in model.layers if isinstance(l, keras.layers.Dense) and l.name != "logits"]
    return dense


def _read(path):
    return json.loads(path.read_text())


def test_prune_then_quantize_then_evaluate(run, digits_dir, capsys, tmp_path):
    summary = _read(run / "summary.json")
    # One fine-tuning epoch (44 steps, a mask update every 3): accuracy_after 0.915 measured (0.868
    # after 3 epochs); the sparsity, sizes and report are the same questions at any length.
    assert run_cli("prune", f"--model_dir={run}", "--target_sparsity=0.75", "--epochs=1") == 0
    report = _read(run / "pruned/report.json")
    assert report["strategy"] == "mirrored" and report["num_replicas"] == 2
    assert abs(report["sparsity"] - 0.75) < 0.01
    pruned_layers = [layer for layer in report["layers"] if "sparsity" in layer]
    assert all(abs(layer["sparsity"] - 0.75) < 0.01 for layer in pruned_layers)
    # Layers with fewer than 2048 kernel weights (--min_weights_to_prune) stay dense.
    assert report["min_weights_to_prune"] == 2048 and report["small_layers"]
    assert {layer["layer"] for layer in report["layers"]} - {l["layer"] for l in pruned_layers} \
        == set(report["small_layers"])
    assert report["problems"] == [] and report["schedule"]["frequency"] < 100
    assert report["gzip_bytes_after"] < 0.6 * report["gzip_bytes_before"]
    for entry in (report["float_tflite"], report["tflite"]):
        assert entry["latency_ms"] > 0 and entry["throughput_ms_per_example"] > 0
        assert (entry["latency_batch_size"], entry["throughput_batch_size"],
                entry["num_threads"]) == (1, 256, 1)
    assert report["nonzero_params_after"] < 0.4 * report["nonzero_params_before"]
    # accuracy_before is the trained model's accuracy on the evaluation (test) split.
    assert abs(report["accuracy_before"] - summary["eval"]["accuracy"]) < 1e-6
    assert report["accuracy_after"] > 0.85
    assert (run / "pruned/saved_model.pb").exists() and (run / "pruned/model.tflite").exists()
    pruned = keras.models.load_model(str(run / "pruned"), compile=False)
    kernel = _hidden_dense(pruned).kernel.numpy()
    assert abs((kernel == 0).mean() - 0.75) < 0.01
    capsys.readouterr()

    assert run_cli("quantize", f"--model_dir={run}", "--mode=int8,float16") == 0
    table = capsys.readouterr().out
    for row in ("| float |", "| pruned |", "| int8 |", "| float16 |"):
        assert row in table
    assert ("| latency ms/example (batch 1, 1 thread) | ms/example (batch 256, 1 thread) |"
            in table)
    int8 = _read(run / "quantized/report_int8.json")
    float16 = _read(run / "quantized/report_float16.json")
    assert _read(run / "quantized/report.json") == float16
    for r in (int8, float16):
        for key in ("mode", "tflite_bytes", "float_tflite_bytes", "accuracy", "float_accuracy"):
            assert key in r, key
        # Two times of each model, with the batch sizes and threads they were measured at.
        for key in ("latency_ms", "float_latency_ms", "throughput_ms_per_example",
                    "float_throughput_ms_per_example", "latency_ratio", "throughput_ratio"):
            assert isinstance(r[key], float) and r[key] > 0, key
        assert r["latency_batch_size"] == 1 and r["throughput_batch_size"] == 256
        assert r["num_threads"] == 1 and r["cpu"]
        assert r["passed"] and r["float_accuracy"] - r["accuracy"] <= 0.01
        assert r["num_examples"] == 189
    assert int8["tflite_bytes"] < 0.5 * int8["float_tflite_bytes"]  # small model: fixed overhead
    assert float16["tflite_bytes"] < 0.7 * float16["float_tflite_bytes"]
    assert abs(int8["float_accuracy"] - summary["eval"]["accuracy"]) < 0.006

    # The .tflite evaluates through `tftrain evaluate` like a SavedModel does.
    output = tmp_path / "eval.json"
    assert run_cli("evaluate", f"--model={run}/quantized/model_int8.tflite",
                   f"--data={digits_dir}", "--split=test", f"--output={output}") == 0
    assert abs(_read(output)["accuracy"] - int8["accuracy"]) < 1e-9


def test_pruning_preserving_qat_from_the_pruned_model(run, capsys):
    if not (run / "pruned/saved_model.pb").exists():
        assert run_cli("prune", f"--model_dir={run}", "--target_sparsity=0.75", "--epochs=1") == 0
    assert run_cli("quantize", f"--model_dir={run}", "--source=pruned", "--mode=qat",
                   "--max_accuracy_drop=0.03") == 0
    report = _read(run / "quantized/report_pruned_qat.json")
    assert report["source"] == "pruned" and report["float_layers"] == []
    assert report["tflite_bytes"] < 0.5 * report["float_tflite_bytes"]
    # The int8 kernels in the .tflite kept the pruned zeros.
    interpreter = tflite_eval.TfliteModel(report["tflite_path"]).interpreter
    kernels = []
    for detail in interpreter.get_tensor_details():
        if detail["dtype"] == np.int8 and len(detail["shape"]) in (2, 4):
            try:
                kernels.append(interpreter.get_tensor(detail["index"]))
            except ValueError:  # an activation, not a constant: no data outside invoke()
                continue
    kernels = [k for k in kernels if k.size >= 2048]  # the pruned ones (--min_weights_to_prune)
    assert len(kernels) >= 2 and all((k == 0).mean() > 0.7 for k in kernels)


def test_accuracy_gate_fires_and_keeps_the_report(run, tmp_path, capsys):
    broken = _copy_run(run, tmp_path / "broken", with_export=False)
    model = keras.models.load_model(saved_model_dir(str(run / "export")), compile=False)
    # One hidden unit always outputs 1e4 and feeds nothing: the float model is unchanged, but int8
    # activations of that layer get a step of ~40, which wipes out every other unit.
    dense = _hidden_dense(model)
    kernel, bias = dense.get_weights()
    bias[0] = 1e4
    dense.set_weights([kernel, bias])
    logits_kernel, logits_bias = model.get_layer("logits").get_weights()
    logits_kernel[0] = 0
    model.get_layer("logits").set_weights([logits_kernel, logits_bias])
    model.save(str(broken / "export"), save_format="tf")

    assert run_cli("quantize", f"--model_dir={broken}", "--mode=int8") == 1
    captured = capsys.readouterr()
    assert "lost too much accuracy" in captured.err and "--max_accuracy_drop=0.01" in captured.err
    assert "| int8 |" in captured.out
    report = _read(broken / "quantized/report_int8.json")
    assert report["passed"] is False and report["accuracy_drop"] > 0.3
    assert report["float_accuracy"] > 0.8


def test_bad_inputs_are_one_clear_error_each(run, tmp_path, capsys):
    no_export = _copy_run(run, tmp_path / "no_export", with_export=False)
    assert run_cli("prune", f"--model_dir={no_export}") == 1
    assert "no export model" in capsys.readouterr().err
    assert run_cli("quantize", f"--model_dir={no_export}", "--mode=dynamic") == 1
    assert "no export model" in capsys.readouterr().err
    assert run_cli("quantize", f"--model_dir={no_export}", "--mode=int8", "--source=pruned") == 1
    assert "tftrain prune --model_dir" in capsys.readouterr().err

    assert run_cli("prune", f"--model_dir={tmp_path}") == 1
    assert "not a tftrain run directory" in capsys.readouterr().err

    for sparsity in ("1.5", "0", "-0.1"):
        assert run_cli("prune", f"--model_dir={run}", f"--target_sparsity={sparsity}") == 2
        assert "outside (0, 1)" in capsys.readouterr().err
    assert run_cli("prune", f"--model_dir={run}", "--sparsity_m_by_n=4:2") == 2
    assert run_cli("quantize", f"--model_dir={run}", "--mode=int4") == 2
    assert "not a quantization mode" in capsys.readouterr().err

    import keras as keras3  # a Keras 3 model where the export should be

    keras3_run = _copy_run(run, tmp_path / "keras3", with_export=False)
    inputs = keras3.Input((8, 8, 1))
    keras3.Model(inputs, keras3.layers.Dense(10)(keras3.layers.Flatten()(inputs))).export(
        str(keras3_run / "export"), format="tf_saved_model")
    assert run_cli("quantize", f"--model_dir={keras3_run}", "--mode=dynamic") == 1
    err = capsys.readouterr().err
    assert "no Keras metadata" in err and "Keras 3" in err and len(err.strip().splitlines()) == 1


def test_prune_and_quantize_keep_what_tftrain_did_not_write(run, tmp_path, capsys):
    copy = _copy_run(run, tmp_path / "copy")
    (copy / "pruned").mkdir()
    (copy / "pruned/notes.txt").write_text("mine")
    (copy / "quantized").mkdir()
    (copy / "quantized/model_dynamic.tflite").write_bytes(b"mine")
    assert run_cli("prune", f"--model_dir={copy}", "--epochs=1") == 1
    assert f"{copy}/pruned was not written by tftrain" in capsys.readouterr().err
    assert run_cli("quantize", f"--model_dir={copy}", "--mode=dynamic") == 1
    assert f"{copy}/quantized was not written by tftrain" in capsys.readouterr().err
    assert os.listdir(copy / "pruned") == ["notes.txt"]
    assert os.listdir(copy / "quantized") == ["model_dynamic.tflite"]
    assert (copy / "quantized/model_dynamic.tflite").read_bytes() == b"mine"


def test_prune_and_quantize_are_refused_while_another_command_writes_the_run(run, tmp_path,
                                                                               capsys):
    busy = _copy_run(run, tmp_path / "busy")
    holder = hold_run_lock(busy)
    try:
        assert run_cli("prune", f"--model_dir={busy}", "--epochs=1") == 1
        assert (f"another tftrain train (pid {holder.pid} on {socket.gethostname()}) is writing "
                f"into {busy}") in capsys.readouterr().err
        assert run_cli("quantize", f"--model_dir={busy}", "--mode=dynamic") == 1
        assert f"another tftrain train (pid {holder.pid}" in capsys.readouterr().err
    finally:
        stop(holder)
    assert not (busy / "pruned").exists() and not (busy / "quantized").exists()


def test_demo_table_from_reports(tmp_path):
    from tftrain.optimize import report

    assert "no prune or quantize reports" in report.demo_table(str(tmp_path))
    (tmp_path / "pruned").mkdir()
    # A report of an older version: one latency, no batch sizes or threads.
    measured = {"accuracy": 0.9, "tflite_bytes": 4000, "gzip_bytes": 1000, "latency_ms": 2.0}
    (tmp_path / "pruned/report.json").write_text(json.dumps({
        "sparsity": 0.8, "sparsity_m_by_n": None,
        "float_tflite": {**measured, "accuracy": 0.92, "gzip_bytes": 3600},
        "tflite": measured}))
    table = report.demo_table(str(tmp_path))
    assert "| float | 0.9200 |" in table
    assert "| latency ms/example (batch 1) | ms/example | note |" in table
    assert ("| pruned | 0.9000 (-2.0 pt) | 3.9 (1.00x) | 1.0 (0.28x) | 2.0000 (1.00x) | - "
            "| 80% sparse |") in table
    timing = {"latency_batch_size": 1, "throughput_batch_size": 128, "num_threads": 2,
              "cpu": "test CPU"}
    report.write_quantized_report(str(tmp_path), {
        "mode": "int8", "source": "export", "accuracy": 0.91, "tflite_bytes": 1000,
        "gzip_bytes": 900, "latency_ms": 0.5, "throughput_ms_per_example": 0.1,
        "float_accuracy": 0.92, "float_tflite_bytes": 4000, "float_gzip_bytes": 3600,
        "float_latency_ms": 2.0, "float_throughput_ms_per_example": 0.4, "passed": False,
        **timing})
    lines = report.demo_table(str(tmp_path)).splitlines()
    assert lines[0] == ("| model | accuracy | .tflite KiB | gzip KiB | latency ms/example "
                        "(batch 1, 2 threads) | ms/example (batch 128, 2 threads) | note |")
    assert lines[-1].startswith("times: LiteRT interpreter on test CPU")
    rows = lines[2:-2]
    assert [row.split("|")[1].strip() for row in rows] == ["float", "pruned", "int8"]
    assert "| 0.5000 (0.25x) | 0.1000 (0.25x) |" in rows[-1]
    assert "FAILED accuracy gate" in rows[-1]
    # The pruned model was timed in another comparison, at other settings: its note says so.
    assert "80% sparse; timed at batch 1/-, ? threads" in rows[1]
    assert json.loads((tmp_path / "quantized/report.json").read_text())["mode"] == "int8"

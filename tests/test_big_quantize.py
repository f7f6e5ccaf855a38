"""`tftrain quantize` of a model too large for some .tflite files (issue #43): LiteRT's
flatbuffer holds at most 2 GiB, so a model over ~537M weights has no float .tflite to measure the
quantized ones against; a mode whose own .tflite would be too large, or a conversion this
machine's memory cannot hold, is refused before anything is converted.

No model here is that large: the limit (`quantize.FLATBUFFER_LIMIT`) and the memory available
(`host.memory_for_this_process`) are lowered around a tiny transformer_lm trained for a few
steps by configs/lm_1b.yaml on subword windows, its blocks recomputed (remat) as lm_1b's are,
copied per test so that quantized/ can be written beside it.
"""
import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.pipeline_testutil import convert

STEPS = 2
BATCH_SIZE = 8
TINY = ("model.params={width: 32, num_layers: 1, num_heads: 2, mlp_width: 64, remat: true},"
        f"data.batch_size={BATCH_SIZE},train.steps=3,train.validation_steps=1,"
        "train.test_steps=1")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The embedded text in windows of 32 SentencePiece ids (512 of them)."""
    path = tmp_path_factory.mktemp("subwords") / "data"
    convert("text", "", path, num_shards=None, workers=1, sequence_length=32,
            tokenizer="sentencepiece", vocab_size=512)
    return path


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    """The tiny transformer_lm run (read-only)."""
    path = tmp_path_factory.mktemp("big_quantize") / "run"
    assert run_cli("train", "--config=lm_1b", f"--model_dir={path}",
                   f"--params_override=data.dir={data_dir},{TINY}") == 0
    return path


@pytest.fixture
def run(trained, tmp_path):
    """A copy of the run's params.yaml and export/."""
    path = tmp_path / "run"
    path.mkdir()
    shutil.copy(trained / "params.yaml", path / "params.yaml")
    shutil.copytree(trained / "export", path / "export")
    return path


@pytest.fixture(scope="module")
def traced_export(trained, tmp_path_factory):
    """The run's export saved again with every layer's traced call, as tftrain saved its
    Transformers before their attention layers were saved under tf-keras's class names (a model
    with any other layer is still saved so): loading it registers the gradient functions of its
    recomputed blocks. Its export/ directory."""
    from tftrain.engine import export
    from tftrain.models.recompute import recomputed_model_class

    recomputed_model_class()  # defined: the export loads as the recomputed model it was
    model = export.load_keras_model(export.saved_model_dir(str(trained / "export")))
    path = tmp_path_factory.mktemp("traced") / "export"
    model.save(str(path / "1"), save_format="tf", include_optimizer=False, save_traces=True)
    return path


def parameters(run) -> int:
    """The run's weights, counted here from its export."""
    from tftrain.optimize.keras_model import load_keras_model
    from tftrain.engine.run_config import read, run_task
    from tftrain.optimize.runs import model_path

    run_task(read(str(run)))  # registers the task's metrics before the load
    return load_keras_model(model_path(str(run))).count_params()


@pytest.fixture
def no_conversion(monkeypatch):
    """Fails the test if anything is converted to TFLite (or saved for a conversion)."""
    from tftrain.optimize import quantize

    def refuse(*args, **kwargs):
        raise AssertionError("a conversion ran")

    for name in ("convert", "convert_saved_model", "save_float32"):
        monkeypatch.setattr(quantize, name, refuse)


def evaluate(run, data_dir, tmp_path, steps: int) -> dict:
    """`tftrain evaluate` of the run's export on the test split's first `steps` batches."""
    output = tmp_path / f"eval_{steps}.json"
    assert run_cli("evaluate", f"--model={run / 'export'}", f"--data={data_dir}",
                   f"--batch_size={BATCH_SIZE}", f"--steps={steps}", f"--output={output}") == 0
    return json.loads(output.read_text())


def test_over_the_limit_the_float_reference_is_the_keras_model(run, data_dir, tmp_path,
                                                                monkeypatch, capsys):
    from tftrain import data
    from tftrain.optimize import quantize, tflite_eval
    from tftrain.engine import run_config

    weights = parameters(run)
    # The float .tflite (4 bytes a weight) is over the limit; int8 weights (1 byte) are not.
    monkeypatch.setattr(quantize, "FLATBUFFER_LIMIT", 3 * weights)
    assert run_cli("quantize", f"--model_dir={run}", "--mode=dynamic", f"--steps={STEPS}",
                   "--max_metric_change=1") == 0
    out = capsys.readouterr().out
    report = json.loads((run / "quantized" / "report_dynamic.json").read_text())
    assert report["reference"] == "keras"
    assert sorted(p.name for p in (run / "quantized").glob("*.tflite")) == [
        "model_dynamic.tflite"]  # no float .tflite was built
    assert [report[key] for key in ("float_tflite_path", "float_tflite_bytes",
                                    "float_latency_ms", "size_ratio")] == [None] * 4
    assert report["float32_weights_bytes"] == 4 * weights
    assert report["size_ratio_to_float32_weights"] == pytest.approx(
        report["tflite_bytes"] / (4 * weights))
    assert (report["num_examples"], report["float_num_examples"]) == (
        STEPS * BATCH_SIZE, STEPS * BATCH_SIZE)

    # The reference is the export measured on the same batches as `tftrain evaluate --steps`
    # measures it (which are not the whole split's: the bound shows).
    bounded = evaluate(run, data_dir, tmp_path, STEPS)
    assert report["float_perplexity"] == pytest.approx(bounded["perplexity"], rel=1e-4)
    assert report["float_metrics"]["loss"] == pytest.approx(bounded["loss"], rel=1e-4)
    whole = evaluate(run, data_dir, tmp_path, 0)
    assert abs(whole["perplexity"] - bounded["perplexity"]) > 1e-3 * bounded["perplexity"]

    # The quantized perplexity is its .tflite's on those batches, and the gate's change is
    # measured against the Keras reference.
    batches = data.load(str(data_dir), "test", BATCH_SIZE, training=False).take(STEPS)
    task = run_config.run_task(run_config.read(str(run)))
    alone = tflite_eval.evaluate_tflite(report["tflite_path"], batches, task=task)
    assert report["perplexity"] == pytest.approx(alone["perplexity"], rel=1e-9)
    assert report["metric_change"] == pytest.approx(
        (report["perplexity"] - report["float_perplexity"]) / report["float_perplexity"])
    assert "the float32 Keras model" in out and "| float | " in out

    # `tftrain report` reads a report without a float .tflite.
    assert run_cli("report", str(run), f"--output={tmp_path / 'report.png'}") == 0
    table = capsys.readouterr().out
    assert f"| {report['float_perplexity']:.4f}, - |" in table, table  # no float .tflite
    assert f"{report['perplexity']:.4f}, {report['gzip_bytes'] / 1024:.1f}" in table, table


def test_a_mode_over_the_limit_is_refused_before_converting(run, monkeypatch, capsys,
                                                            no_conversion):
    from tftrain.optimize import quantize

    weights = parameters(run)
    limit = 3 * weights // 2  # float16 (2 bytes a weight) is over it, int8 (1 byte) is not
    monkeypatch.setattr(quantize, "FLATBUFFER_LIMIT", limit)
    assert run_cli("quantize", f"--model_dir={run}", "--mode=float16", "--steps=1") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{weights:,} weights" in err, err
    assert f"a float16 .tflite of ~{2 * weights / 2**30:.2f} GiB" in err, err
    assert f"LiteRT's {limit / 2**30:g} GiB flatbuffer limit" in err, err
    assert "modes that fit: dynamic, int8, qat" in err, err
    assert not (run / "quantized").exists()


def test_a_conversion_the_memory_cannot_hold_is_refused_before_converting(
        run, monkeypatch, capsys, no_conversion):
    from tftrain import host
    from tftrain.optimize import quantize

    weights = parameters(run)
    need = {mode: quantize.estimated_memory(weights, mode, quantize.TFLITE)
            for mode in ("dynamic", "float16")}
    small, large = sorted(need, key=need.get)
    assert need[small] < need[large]  # else the question below cannot be asked
    monkeypatch.setattr(host, "memory_for_this_process", lambda: need[small] + 1)
    assert run_cli("quantize", f"--model_dir={run}", f"--mode={large}", "--steps=1") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{weights:,} weights" in err, err
    assert f"needs an estimated ~{need[large] / 2**30:.2f} GiB" in err, err
    assert f"~{(need[small] + 1) / 2**30:.2f} GiB is available" in err, err
    assert f"modes that fit: {small} (~{need[small] / 2**30:.2f} GiB)" in err, err
    assert large not in err.split("modes that fit:")[1], err
    assert not (run / "quantized").exists()


@pytest.mark.parametrize("limit,expected", [
    (f"{3 << 30}", (1 << 30) + (256 << 20)),  # cgroup v2: under the limit, the inactive cache free
    ("max", 20 << 30),  # no limit: MemAvailable
    (str(2**63 - 4096), 20 << 30),  # cgroup v1's "no limit"
    (f"{40 << 30}", 20 << 30),  # a limit above MemAvailable: MemAvailable
])
def test_the_memory_available_to_a_command(limit, expected, tmp_path, monkeypatch):
    from tftrain import host

    files = (tmp_path / "memory.max", tmp_path / "memory.current", tmp_path / "memory.stat")
    for path, text in zip(files, (limit, f"{2 << 30}", f"anon 5\ninactive_file {256 << 20}\n")):
        path.write_text(text + "\n")
    monkeypatch.setattr(host, "_CGROUP_FILES", (tuple(map(str, files)),))
    monkeypatch.setattr(host, "available_memory", lambda: 20 << 30)
    monkeypatch.setattr(host, "_status_bytes",
                        lambda field: 100 << 20 if field == "RssAnon" else None)
    assert host.memory_for_this_process() == expected + (100 << 20)  # plus what it holds


@pytest.mark.parametrize("reference,traced", [("tflite", False), ("keras", True)])
def test_every_conversion_reads_one_plain_saved_model_without_the_keras_model(
        reference, traced, run, traced_export, monkeypatch):
    """The float reference and each mode convert from one SavedModel that quantize writes into
    quantized/ and removes: the model's variables and its serving signature, no Keras object
    (a Keras save traces every layer's call: seconds per conversion, and memory), read after
    the loaded Keras model is gone (also after it measured itself as the reference), and after
    the gradient functions that loading an export with traces registers are forgotten (an
    export without them registers none)."""
    import gc
    import weakref

    from tf_keras.src.saving.legacy.saved_model import save_impl

    from tftrain import run_dir
    from tftrain.optimize import quantize, runs
    from tftrain.optimize.keras_model import custom_gradients

    if reference == "keras":  # the float .tflite over the limit, float16's not
        monkeypatch.setattr(quantize, "FLATBUFFER_LIMIT", 3 * parameters(run))
    if traced:
        shutil.rmtree(run / "export")
        shutil.copytree(traced_export, run / "export")
    loaded, traces, conversions, registered = [], [], [], []
    before = custom_gradients()
    load = runs.load_keras_model
    wrap = save_impl.wrap_layer_functions
    convert_saved_model = quantize.convert_saved_model

    def load_and_watch(*args, **kwargs):
        model = load(*args, **kwargs)
        loaded.append(weakref.ref(model))
        registered.append(custom_gradients() - before)  # remat's, holding the weights
        return model

    def watch_traces(layer, *args, **kwargs):  # a Keras SavedModel's per-layer traces
        traces.append(layer.name)
        return wrap(layer, *args, **kwargs)

    def convert_and_watch(path, mode, **kwargs):
        gc.collect()
        names = sorted(p.name for p in Path(path).iterdir())
        conversions.append((path, mode, names, [ref() is None for ref in loaded],
                            custom_gradients() - before))
        return convert_saved_model(path, mode, **kwargs)

    # A stopped quantize left its temporary SavedModel (marked as tftrain's): replaced.
    stale = run / "quantized" / runs.FLOAT32_SAVED_MODEL
    run_dir.mark_output(str(stale))
    (stale / "stale.txt").write_text("from the stopped command")
    run_dir.mark_output(str(run / "quantized"))
    monkeypatch.setattr(runs, "load_keras_model", load_and_watch)
    monkeypatch.setattr(save_impl, "wrap_layer_functions", watch_traces)
    monkeypatch.setattr(quantize, "convert_saved_model", convert_and_watch)
    assert run_cli("quantize", f"--model_dir={run}", "--mode=dynamic,float16", "--steps=1",
                   "--max_metric_change=1") == 0
    assert traces == []
    assert json.loads((run / "quantized" / "report.json").read_text())["reference"] == reference
    saved = str(run / "quantized" / runs.FLOAT32_SAVED_MODEL)
    floats = ["float"] if reference == "tflite" else []
    assert [(path, mode) for path, mode, *_ in conversions] == [
        (saved, mode) for mode in floats + ["dynamic", "float16"]]
    # lm_1b's blocks are recomputed (remat): their gradients are in the traces, if any
    assert len(registered) == 1 and bool(registered[0]) == traced
    for _, mode, names, dropped, gradients in conversions:
        assert "saved_model.pb" in names and "keras_metadata.pb" not in names, (mode, names)
        assert "stale.txt" not in names, (mode, names)
        # The one Keras model loaded was freed before, and with it the gradient functions of
        # its recomputed blocks, which would hold its weights for the rest of the process.
        assert dropped == [True], mode
        assert gradients == frozenset(), (mode, gradients)
    # What quantize documents, and nothing else: its temporary SavedModel is gone.
    assert sorted(p.name for p in (run / "quantized").iterdir()) == sorted(
        [".tftrain.json", "report.json"] + [f"model_{mode}.tflite" for mode in floats]
        + [f"{kind}_{mode}.{ext}" for mode in ("dynamic", "float16")
           for kind, ext in (("model", "tflite"), ("report", "json"))])


def test_a_folder_of_the_temporary_saved_models_name_that_tftrain_did_not_write_is_kept(
        run, monkeypatch, capsys, no_conversion):
    from tftrain import run_dir
    from tftrain.optimize import runs

    run_dir.mark_output(str(run / "quantized"))  # quantized/ is tftrain's, the folder in it not
    left = run / "quantized" / runs.FLOAT32_SAVED_MODEL
    left.mkdir()
    (left / "keep.txt").write_text("not tftrain's")
    assert run_cli("quantize", f"--model_dir={run}", "--mode=dynamic", "--steps=1") == 1
    err = capsys.readouterr().err.strip()
    assert f"{left} was not written by tftrain" in err and len(err.splitlines()) == 1, err
    assert (left / "keep.txt").read_text() == "not tftrain's"

"""The gates of `tftrain prune` and `tftrain quantize`: which arguments are refused, when a
pruned layer missed its sparsity or m:n structure, when an optimized model lost too much of the
task's measure (at the bound exactly, and just past it), and the reports and errors that say
so. Pure functions over numbers and report records (no model, no TFLite); `make mutation` runs
them."""
import dataclasses
import json
import logging
import os
from types import SimpleNamespace

import numpy as np
import pytest

from tftrain.errors import ConfigError, TftrainError
from tftrain.optimize import prune, quantize, report, runs
from tftrain.optimize.runs import PruneOptions, QuantizeOptions
from tftrain.tasks.classification import ClassificationTask
from tftrain.tasks.language_model import LanguageModelTask
from tftrain.tasks.regression import RegressionTask

CLASSIFIER = ClassificationTask({}, num_classes=3)
REGRESSOR = RegressionTask({})


def refused(call, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as raised:
        call(*args, **kwargs)
    return str(raised.value)


# ---- prune's arguments ---------------------------------------------------------------------

@pytest.mark.parametrize("steps_per_epoch, epochs", [
    (0, 1200), (1, 1200), (2, 600), (399, 4), (400, 3), (401, 3), (599, 3), (600, 2),
    (1199, 2), (1200, 2), (5000, 2)])
def test_finetune_epochs(steps_per_epoch, epochs):
    got = prune.finetune_epochs(steps_per_epoch)
    assert got == epochs and type(got) is int


def test_target_sparsity_is_a_fraction_strictly_inside_0_1():
    for target in (1e-9, 0.5, 0.999999):
        assert prune.check_target_sparsity(target) == target
    assert type(prune.check_target_sparsity(np.float32(0.5))) is float
    for target in (0.0, 1.0, -0.1, 1.5):
        assert refused(prune.check_target_sparsity, target) == (
            f"--target_sparsity={target} is outside (0, 1): it is the fraction of weights set "
            "to zero, e.g. 0.8 for 80%.")


def test_m_by_n():
    assert prune.parse_m_by_n("2:4") == (2, 4)
    assert prune.parse_m_by_n("1:2") == (1, 2)
    assert prune.parse_m_by_n("") is None and prune.parse_m_by_n(None) is None
    for text in ("2-4", "2:4:8", "a:4", "2"):
        assert refused(prune.parse_m_by_n, text) == \
            f"--sparsity_m_by_n={text!r} is not M:N (e.g. 2:4)"
    for text in ("0:4", "4:4", "5:4", "-1:4"):
        assert refused(prune.parse_m_by_n, text) == \
            f"--sparsity_m_by_n={text!r}: need 0 < M < N (e.g. 2:4)"


@pytest.mark.parametrize("total, ramp_end, frequency", [
    (1, 1, 1), (2, 1, 1), (3, 2, 1), (10, 6, 1), (12, 8, 1), (13, 8, 1), (100, 64, 8),
    (1200, 800, 100), (1000, 664, 83)])
def test_the_schedule_follows_the_steps(total, ramp_end, frequency):
    for kind in ("polynomial", "constant"):
        schedule = prune.make_schedule(kind, 0.75, total)
        assert schedule == prune.Schedule(kind, 0.75, total, ramp_end, frequency)
        assert type(schedule.end_step) is int and type(schedule.frequency) is int


def test_a_schedule_that_cannot_be():
    assert refused(prune.make_schedule, "linear", 0.5, 10) == (
        "unknown pruning schedule 'linear'; choose one of polynomial, constant")
    assert refused(prune.make_schedule, "constant", 1.0, 10).startswith("--target_sparsity=1.0")
    assert refused(prune.make_schedule, "constant", 0.5, 0) == (
        "pruning needs at least one fine-tuning step, got 0")


STEPS_REFUSED = ("--steps=-1 must be >= 0: the number of batches to measure, or 0 for the "
                 "whole split")


def test_prune_options():
    PruneOptions().check()
    PruneOptions(m_by_n="2:4", epochs=1).check()
    assert refused(PruneOptions(target_sparsity=1.0).check).startswith("--target_sparsity=1.0")
    assert refused(PruneOptions(m_by_n="2-4").check).startswith("--sparsity_m_by_n='2-4'")
    assert refused(PruneOptions(epochs=0).check) == (
        "--epochs=0: pruning needs at least one fine-tuning epoch")
    PruneOptions(eval_steps=0).check()
    PruneOptions(eval_steps=3).check()
    assert refused(PruneOptions(eval_steps=-1).check) == STEPS_REFUSED


# ---- the m:n structure and the sparsity reached -------------------------------------------------

def two_of_four_along_inputs(shape):
    """A kernel whose every 4 consecutive input channels, for each output, hold exactly 2
    zeros (and whose outputs do not)."""
    kernel = np.ones(shape)
    kernel[..., 0::4, :] = 0
    kernel[..., 1::4, :] = 0
    return kernel


def test_m_by_n_blocks_run_along_the_input_channels():
    dense = two_of_four_along_inputs((8, 3))
    assert prune.m_by_n_ok(dense, (2, 4)) is True
    assert prune.m_by_n_ok(dense, (3, 4)) is False  # 2 zeros per block, not 3
    assert prune.m_by_n_ok(dense.tolist(), (2, 4)) is True
    conv = two_of_four_along_inputs((2, 2, 4, 3))
    assert prune.m_by_n_ok(conv, (2, 4)) is True
    # The same zeros laid along the outputs do not hold the structure along the inputs.
    assert prune.m_by_n_ok(np.ascontiguousarray(dense.T), (2, 4)) is None  # 3 inputs
    along_outputs = np.ones((4, 8))
    along_outputs[:, 0::4] = along_outputs[:, 1::4] = 0
    assert prune.m_by_n_ok(along_outputs, (2, 4)) is False
    broken = dense.copy()
    broken[0, 2] = 1  # one block of one output with a single zero
    assert prune.m_by_n_ok(broken, (2, 4)) is False


def test_m_by_n_is_unknown_for_other_layouts():
    assert prune.m_by_n_ok(np.zeros((6, 3)), (2, 4)) is None  # 6 inputs: not blocks of 4
    assert prune.m_by_n_ok(np.zeros((2, 6, 3)), (2, 4)) is None  # rank 3
    assert prune.m_by_n_ok(np.zeros(8), (2, 4)) is None
    assert prune.m_by_n_ok(np.zeros((1, 1, 1, 8, 3)), (2, 4)) is None
    assert prune.m_by_n_ok(np.zeros((3, 3, 6, 2)), (2, 4)) is None


def layer(name, sparsity=None, m_by_n_ok=None):
    entry = {"layer": name, "params": 10}
    if sparsity is not None:
        entry["sparsity"] = sparsity
    if m_by_n_ok is not None:
        entry["m_by_n_ok"] = m_by_n_ok
    return entry


def test_a_layer_short_of_the_target_sparsity_is_a_problem():
    layers = [layer("dense"), layer("a", 0.8 - 0.02), layer("b", 0.79), layer("c", 0.77),
              layer("d", 0.0, m_by_n_ok=True)]
    assert prune.check_sparsity_reached({"layers": layers}, 0.8) == [
        "layer c reached 77.0% sparsity, target 80%", "layer d reached 0.0% sparsity, target 80%"]
    assert prune.check_sparsity_reached({"layers": layers}, 0.8, tolerance=0.0) == [
        "layer a reached 78.0% sparsity, target 80%", "layer b reached 79.0% sparsity, target 80%",
        "layer c reached 77.0% sparsity, target 80%", "layer d reached 0.0% sparsity, target 80%"]
    assert prune.check_sparsity_reached({"layers": [layer("dense")]}, 0.8) == []


def test_under_m_by_n_only_the_structure_counts():
    layers = [layer("a", 0.1, m_by_n_ok=True), layer("b", 0.5, m_by_n_ok=False),
              layer("c", 0.0, m_by_n_ok=None), layer("d", 0.0), layer("e")]
    assert prune.check_sparsity_reached({"layers": layers}, 0.5, (2, 4)) == [
        "layer b does not hold 2:4 sparsity"]


# ---- quantize's arguments ---------------------------------------------------------------------

def test_quantization_modes():
    for mode in quantize.MODES:
        assert quantize.check_mode(mode) == mode
    assert refused(quantize.check_mode, "int4") == (
        "--mode='int4' is not a quantization mode; choose one of dynamic, int8, float16, qat")


def test_quantize_options():
    QuantizeOptions(["int8", "qat"], max_accuracy_drop=0, max_metric_change=0).check()
    assert refused(QuantizeOptions(["int8", "int4"]).check).startswith("--mode='int4'")
    assert refused(QuantizeOptions([]).check) == (
        "--mode is empty: give dynamic, int8, float16 or qat")
    assert refused(QuantizeOptions(["int8"], max_accuracy_drop=-0.01).check) == (
        "--max_accuracy_drop=-0.01 must be >= 0")
    assert refused(QuantizeOptions(["int8"], max_metric_change=-1).check) == (
        "--max_metric_change=-1 must be >= 0")
    QuantizeOptions(["int8"], eval_steps=3).check()
    assert refused(QuantizeOptions(["int8"], eval_steps=-1).check) == STEPS_REFUSED


def test_each_task_is_bounded_by_its_own_flag():
    options = QuantizeOptions(["int8"], max_accuracy_drop=0.02, max_metric_change=0.3)
    assert options.max_change(CLASSIFIER) == 0.02
    assert options.max_change(REGRESSOR) == 0.3
    assert options.max_change(LanguageModelTask({"vocab_size": 4})) == 0.3


@pytest.mark.parametrize("int8_io, mode, expected", [
    (True, "int8", True), (True, "qat", True), (True, "dynamic", False),
    (True, "float16", False), (False, "int8", False), (False, "qat", False)])
def test_int8_inputs_and_outputs_only_for_integer_models(int8_io, mode, expected):
    assert QuantizeOptions([mode], int8_io=int8_io).int8_io_for(mode) is expected


def test_a_gate_flag_must_be_the_tasks():
    runs.check_gate(CLASSIFIER, None, "--max_metric_change")  # not given: nothing to check
    runs.check_gate(REGRESSOR, 0.0, "--max_metric_change")
    runs.check_gate(CLASSIFIER, 0.5, "--max_accuracy_drop")
    assert refused(runs.check_gate, REGRESSOR, 0.1, "--max_accuracy_drop") == (
        "--max_accuracy_drop bounds the change of another task's measure; this run's task is "
        "regression: bound its rmse with --max_metric_change")
    assert refused(runs.check_gate, REGRESSOR, -0.1, "--max_metric_change") == (
        "--max_metric_change=-0.1 must be >= 0")


# ---- the pruning report and its gate ------------------------------------------------------------

MirroredStrategy = type("MirroredStrategy", (), {"num_replicas_in_sync": 2})
CONFIG = SimpleNamespace(train=SimpleNamespace(learning_rate=0.4))
SCHEDULE = prune.Schedule("polynomial", 0.75, 300, 192, 24)


def keras_measure(rmse, sparsity=0.75, layers=()):
    return report.KerasMeasurement(
        metrics={"loss": rmse ** 2, "rmse": rmse, "accuracy": 1 / (1 + rmse)},
        sparsity=sparsity, pruned_params=16, num_params=24, nonzero_params=8,
        layers=list(layers), gzip_bytes=100)


def pruning_report(options, before=1.0, after=1.0, layers=(), distilled=False, task=REGRESSOR):
    result = prune.PruneResult(model=None, schedule=SCHEDULE, m_by_n=options.structure,
                               pruned_weights=set(), unsupported_layers=["lstm"],
                               small_layers=["logits"], distilled=distilled)
    return runs._pruning_report(
        result, keras_measure(before), keras_measure(after, layers=layers),
        {"float": "float.tflite", "model": "model.tflite"}, CONFIG, task, options,
        MirroredStrategy(), source="/run/export/1", split="test", steps_per_epoch=100, epochs=3)


def test_the_pruning_report_records_the_settings():
    options = PruneOptions(target_sparsity=0.75, learning_rate=0.01, distill_weight=0.3,
                           temperature=3.0, min_weights=64)
    summary = pruning_report(options, before=2.0, after=2.5, distilled=True)
    assert summary == report.PruneReport(
        source="/run/export/1", split="test", strategy="mirrored", num_replicas=2,
        target_sparsity=0.75, sparsity_m_by_n=None, schedule=dataclasses.asdict(SCHEDULE),
        epochs=3, steps_per_epoch=100, learning_rate=0.01, distill_weight=0.3,
        distill_temperature=3.0, task="regression", measure="rmse",
        change_name="metric_change", change=0.25, before=keras_measure(2.0),
        after=keras_measure(2.5), float_tflite="float.tflite", tflite="model.tflite",
        unsupported_layers=["lstm"], min_weights_to_prune=64, small_layers=["logits"],
        problems=(), max_metric_change=None)
    # m:n instead of a target; not distilled; the run's rate / 4 by default
    summary = pruning_report(PruneOptions(m_by_n="2:4", distill_weight=0.3), task=CLASSIFIER)
    assert (summary.target_sparsity, summary.sparsity_m_by_n, summary.learning_rate,
            summary.distill_weight, summary.distill_temperature) == (None, "2:4", 0.1, 0.0, None)
    assert (summary.task, summary.measure, summary.change_name) == (
        "classification", "accuracy", "accuracy_drop")
    assert pruning_report(PruneOptions(m_by_n="")).sparsity_m_by_n is None


def test_the_pruning_report_lists_the_problems():
    layers = [layer("a", 0.5), layer("b", 0.75, m_by_n_ok=False)]
    assert pruning_report(PruneOptions(target_sparsity=0.75), layers=layers).problems == (
        "layer a reached 50.0% sparsity, target 75%",)
    summary = pruning_report(PruneOptions(m_by_n="2:4", max_metric_change=0.1), before=2.0,
                             after=2.5, layers=layers)
    assert summary.problems == (
        "layer b does not hold 2:4 sparsity",
        "rmse 2.5000 vs float 2.0000 (metric_change 0.2500 > --max_metric_change=0.1)")
    assert summary.max_metric_change == 0.1


def test_the_prune_gate_at_its_bound():
    # The change is compared with the bound plus 1e-9: exactly at it passes, past it fails.
    at = pruning_report(PruneOptions(max_metric_change=0.25), before=2.0, after=2.5)
    assert at.change == 0.25 and at.problems == ()
    # change = 1 / 1e9 = 1e-9 exactly: at a bound of 0 it is within the 1e-9 allowance.
    assert pruning_report(PruneOptions(max_metric_change=0.0), before=1e9,
                          after=1e9 + 1).problems == ()
    assert len(pruning_report(PruneOptions(max_metric_change=0.0), before=1e9,
                              after=1e9 + 2).problems) == 1
    assert len(pruning_report(PruneOptions(max_metric_change=0.2), before=2.0,
                              after=2.5).problems) == 1
    assert pruning_report(PruneOptions(max_metric_change=0.3), before=2.0,
                          after=2.5).problems == ()
    assert pruning_report(PruneOptions(max_metric_change=0.5), before=2.0,
                          after=1.0).problems == ()  # better is never a problem


def test_the_pruning_report_records_its_steps_bound():
    assert pruning_report(PruneOptions(eval_steps=7)).eval_steps == 7
    assert pruning_report(PruneOptions()).eval_steps is None


def test_a_pruning_report_with_problems_fails_the_run():
    runs._prune_gate(SimpleNamespace(problems=()), "/run/pruned")
    with pytest.raises(TftrainError) as raised:
        runs._prune_gate(SimpleNamespace(problems=("one", "two")), "/run/pruned")
    assert str(raised.value) == (
        "pruning missed its target (one; two); the report is in /run/pruned/report.json. "
        "Fine-tune longer (--epochs), prune less, or check the layers named.")


# ---- the quantization reports and their gate ----------------------------------------------------

def measured(path, **metrics):
    return report.TfliteMeasurement(
        path=path, metrics=metrics, num_examples=10, tflite_bytes=1000, gzip_bytes=900,
        latency_ms=1.0, latency_batch_size=1, throughput_ms_per_example=0.5,
        throughput_batch_size=256, num_threads=1, cpu="cpu")


def quantized_report(mode, options, task, reference, result, extra=None):
    timed = {report.model_name("float", options.source): reference,
             report.model_name(mode, options.source): result}
    return runs._quantized_report(mode, options, task, timed, path="/run/export/1",
                                  split="test", extra=extra or {})


def test_a_quantization_report_against_its_float_reference():
    reference = measured("float.tflite", loss=0.3, accuracy=0.9)
    result = measured("int8.tflite", loss=0.35, accuracy=0.85, latency_ms=2.0)
    options = QuantizeOptions(["int8"], max_accuracy_drop=0.02, int8_io=True)
    entry = quantized_report("int8", options, CLASSIFIER, reference, result,
                             {"num_calibration_examples": 50})
    assert entry == report.QuantizeReport(
        mode="int8", source="export", model="/run/export/1", split="test",
        task="classification", measure="accuracy", change_name="accuracy_drop",
        change=0.9 - 0.85, max_change=0.02, metrics={"loss": 0.35, "accuracy": 0.85},
        float_metrics={"loss": 0.3, "accuracy": 0.9}, tflite=result, float_tflite=reference,
        int8_io=True, num_calibration_examples=50)
    assert not entry.passed


def test_a_quantization_report_of_the_pruned_model():
    reference = measured("pruned_float.tflite", rmse=2.0, mae=1.0)
    result = measured("pruned_dynamic.tflite", rmse=2.1, mae=1.1)
    options = QuantizeOptions(["dynamic"], source="pruned", max_metric_change=0.1, int8_io=True)
    entry = quantized_report("dynamic", options, REGRESSOR, reference, result)
    assert (entry.mode, entry.source, entry.measure, entry.change_name) == (
        "dynamic", "pruned", "rmse", "metric_change")
    assert entry.change == pytest.approx(0.05) and entry.max_change == 0.1
    assert entry.metrics == {"rmse": 2.1, "mae": 1.1}
    assert entry.float_metrics == {"rmse": 2.0, "mae": 1.0}
    assert entry.int8_io is False and entry.passed


def test_a_quantization_report_against_the_keras_reference():
    """Over LiteRT's flatbuffer limit no float .tflite exists: the float32 Keras model is the
    reference the change and the float metrics come from, and the report says so."""
    keras = report.KerasMeasurement(
        metrics={"loss": 0.2, "accuracy": 0.95}, sparsity=0.0, pruned_params=0, num_params=24,
        nonzero_params=24, layers=[], gzip_bytes=100)
    result = measured("int8.tflite", loss=0.35, accuracy=0.85)
    options = QuantizeOptions(["int8"], max_accuracy_drop=0.2, eval_steps=4)
    timed = {report.model_name("int8", options.source): result}  # no float .tflite
    entry = runs._quantized_report("int8", options, CLASSIFIER, timed, path="/run/export/1",
                                   split="test", extra={}, keras_reference=keras)
    assert entry.float_tflite is None and entry.float_keras == keras
    assert entry.reference == "keras" and entry.float_measure == 0.95
    assert entry.change == pytest.approx(0.95 - 0.85) and entry.passed
    assert entry.float_metrics == {"loss": 0.2, "accuracy": 0.95}
    assert entry.eval_steps == 4


def test_the_quantize_gate_at_its_bound():
    def passed(before, after, bound):
        return quantized_report(
            "int8", QuantizeOptions(["int8"], max_accuracy_drop=bound), CLASSIFIER,
            measured("f", accuracy=before), measured("q", accuracy=after)).passed

    assert passed(0.9, 0.9, 0.0)
    assert passed(1e-9, 0.0, 0.0)  # within the 1e-9 allowance
    assert not passed(3e-9, 0.0, 0.0)
    assert passed(0.5, 0.25, 0.25) and not passed(0.5, 0.25, 0.24)


def quantize_entry(mode, accuracy, bound=0.01):
    return quantized_report(mode, QuantizeOptions([mode], max_accuracy_drop=bound), CLASSIFIER,
                            measured("f", loss=0.1, accuracy=0.9),
                            measured("q", loss=0.1, accuracy=accuracy))


def test_every_report_is_written_before_the_gate_fails(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="absl")
    run = str(tmp_path)
    entries = [quantize_entry("int8", 0.85), quantize_entry("float16", 0.9),
               quantize_entry("dynamic", 0.8)]
    with pytest.raises(TftrainError) as raised:
        runs._write_and_gate(run, entries, CLASSIFIER, f"{run}/quantized")
    assert str(raised.value) == (
        "quantization lost too much accuracy: "
        f"int8: accuracy 0.8500 vs float 0.9000 (accuracy_drop 0.0500 > --max_accuracy_drop=0.01)"
        f"; report kept at {run}/quantized/report_int8.json; "
        f"dynamic: accuracy 0.8000 vs float 0.9000 (accuracy_drop 0.1000 > "
        f"--max_accuracy_drop=0.01); report kept at {run}/quantized/report_dynamic.json")
    for mode in ("int8", "float16", "dynamic"):
        written = json.load(open(os.path.join(run, "quantized", f"report_{mode}.json")))
        assert written["mode"] == mode
    assert [r.getMessage() for r in caplog.records if r.name == "absl"] == [
        f"quantized models and reports in {run}/quantized"]


def test_a_failed_gate_names_the_pruned_models_report(tmp_path):
    options = QuantizeOptions(["float16"], source="pruned", max_accuracy_drop=0.0)
    entry = quantized_report("float16", options, CLASSIFIER, measured("f", accuracy=0.9),
                             measured("q", accuracy=0.8))
    with pytest.raises(TftrainError) as raised:
        runs._write_and_gate(str(tmp_path), [entry], CLASSIFIER, "out")
    assert str(raised.value).startswith("quantization lost too much accuracy: pruned_float16: ")
    assert str(raised.value).endswith(f"; report kept at {tmp_path}/quantized/"
                                      "report_pruned_float16.json")


def test_reports_within_their_gate_pass(tmp_path):
    runs._write_and_gate(str(tmp_path), [quantize_entry("int8", 0.895)], CLASSIFIER, "out")
    assert os.path.exists(tmp_path / "quantized" / "report_int8.json")

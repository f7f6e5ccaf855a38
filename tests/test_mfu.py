"""Model FLOPs utilization: the model's FLOPs per example counted by hand for small models, the
CPU's measured peak cached per host, and MFU in summary.json and the progress line (through
tests/test_bounded_evaluation.py's run)."""
import json

import pytest


def test_an_mlps_flops_are_its_matmuls():
    from tftrain import models
    from tftrain.models import flops

    model = models.build_model("mlp", {"hidden_units": [256, 128]}, (8, 8, 1), 10)
    forward = 2 * (64 * 256 + 256 * 128 + 128 * 10)  # a multiply-add is 2 FLOPs
    assert flops.forward_flops_per_example(model) == (forward, [])
    assert flops.training_flops_per_example(model) == 3 * forward


def test_a_convolution_counts_its_kernel_at_every_output_position():
    from tftrain import models
    from tftrain.models import flops

    model = models.build_model("cnn", {"filters": [4], "dense_units": 8, "dropout": 0},
                               (8, 8, 1), 10)
    conv = 2 * (3 * 3 * 1 * 4) * 8 * 8 + 2 * (3 * 3 * 4 * 4) * 8 * 8  # two convs, same padding
    dense = 2 * (4 * 4 * 4 * 8) + 2 * (8 * 10)  # after 2x2 pooling: 4x4x4 flattened
    assert flops.forward_flops_per_example(model)[0] == conv + dense


def test_attention_counts_projections_and_both_matmuls_and_remat_adds_nothing():
    from tftrain import models
    from tftrain.models import flops

    info = {"vocab_size": 50, "sequence_length": 16}
    params = {"width": 32, "num_layers": 2, "num_heads": 4, "mlp_width": 64}
    plain = models.build_model("transformer_lm", params, (16,), 50, info)
    recomputed = models.build_model("transformer_lm", {**params, "remat": True}, (16,), 50, info)
    t, d, heads = 16, 32, 4
    attention = 4 * 2 * d * d * t + 2 * 2 * heads * t * t * (d // heads)
    mlp = 2 * 2 * d * 64 * t
    head = 2 * d * 50 * t
    expected = 2 * (attention + mlp) + head
    assert flops.forward_flops_per_example(plain) == (expected, [])
    assert flops.forward_flops_per_example(recomputed)[0] == expected


def test_the_cpu_peak_is_measured_once_per_host_and_precision(tmp_path, monkeypatch):
    from tftrain.runtime import peak_flops

    monkeypatch.setenv("TFTRAIN_CACHE_DIR", str(tmp_path))
    measured, values = [], []
    real = peak_flops.measure_matmul
    monkeypatch.setattr(peak_flops, "measure_matmul", lambda dtype: measured.append(dtype) or
                        values.append(real(dtype, size=256, seconds=0.05)) or values[-1])
    first = peak_flops.cpu_peak("float32")
    assert first == values[0] > 1e8 and measured == ["float32"]  # the measurement itself
    assert peak_flops.cpu_peak("float32") == first and measured == ["float32"]  # cached
    assert peak_flops.cpu_peak("mixed_bfloat16") == values[1]
    assert measured == ["float32", "bfloat16"]
    cache = json.loads((tmp_path / "peak_flops.json").read_text())
    assert sorted(cache.values()) == sorted(values) and all("cores" in key for key in cache)
    assert {key.split("|")[2] for key in cache} == {"float32", "bfloat16"}


def test_the_matmul_peak_is_its_flops_over_the_fastest_round(monkeypatch):
    """2 n^3 FLOPs per n x n matmul over the shortest timed round, on a fake clock (its calls:
    the deadline, then per round the loop's test, the start and the end): rounds of 4, 2 and
    3 ms in a 10 ms budget."""
    import types

    from tftrain.runtime import peak_flops

    readings = iter(ms / 1000 for ms in [0, 0, 0, 4, 4, 4, 6, 6, 6, 9, 20])
    monkeypatch.setattr(peak_flops, "time", types.SimpleNamespace(
        perf_counter=lambda: next(readings)))
    size = 64
    assert peak_flops.measure_matmul("float32", size=size, seconds=0.010) == pytest.approx(
        2 * size**3 / 0.002)


def test_published_peaks_follow_the_precision():
    from tftrain.runtime import peak_flops

    assert peak_flops.device_peak("GPU", "mixed_bfloat16", gpu_name="NVIDIA A100-SXM4-80GB") == (
        312e12, "published peak of NVIDIA A100-SXM4-80GB")
    assert peak_flops.device_peak("GPU", "float32", gpu_name="NVIDIA H100 80GB HBM3")[0] == 494.7e12
    assert peak_flops.device_peak("TPU", "mixed_bfloat16", tpu_type="v5e")[0] == 197e12
    assert peak_flops.device_peak("GPU", "float32", gpu_name="Mystery GPU")[0] is None


def test_a_cpu_peak_measured_under_load_is_raised_when_a_run_computes_faster(tmp_path,
                                                                             monkeypatch):
    """A cached peak below what a run achieved was measured under load: it is measured again
    and raised to at least the run's rate, so MFU stays at most 100%."""
    from tftrain.engine.utilization import Utilization
    from tftrain.runtime import peak_flops

    monkeypatch.setenv("TFTRAIN_CACHE_DIR", str(tmp_path))
    values = []
    real = peak_flops.measure_matmul
    monkeypatch.setattr(peak_flops, "measure_matmul", lambda dtype: values.append(
        real(dtype, size=256, seconds=0.05)) or values[-1])
    quiet = peak_flops.cpu_peak("float32")
    _, key, path = peak_flops._cache_entry("float32")
    with open(path, "w", encoding="utf-8") as f:  # as if measured while neighbours were busy
        json.dump({key: quiet / 100}, f)
    usage = Utilization(1_000_000, quiet / 100, "measured", 1, "float32", measured_here=True)
    examples_per_second = quiet / 50 / 1_000_000  # twice the loaded peak
    achieved = 1_000_000 * examples_per_second
    assert usage.mfu(examples_per_second) == pytest.approx(2.0)
    confirmed = usage.confirmed(examples_per_second)
    assert len(values) == 2  # measured again
    assert confirmed.peak_flops_per_second == max(values[1], achieved)
    assert confirmed.mfu(examples_per_second) == pytest.approx(
        achieved / confirmed.peak_flops_per_second)
    assert peak_flops.cpu_peak("float32") == confirmed.peak_flops_per_second  # cached
    # Measured again under even more load: the run's own rate is the peak, MFU exactly 100%.
    monkeypatch.setattr(peak_flops, "measure_matmul", lambda dtype: quiet / 1000)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({key: quiet / 100}, f)
    raised = usage.confirmed(examples_per_second)
    assert raised.peak_flops_per_second == achieved and raised.mfu(examples_per_second) == 1.0
    assert usage.confirmed(examples_per_second / 4) is usage  # below the peak: kept as it is
    published = Utilization(1_000_000, 1e6, "published peak of a TPU v4", 4, "float32")
    assert published.confirmed(examples_per_second) is published  # never re-measured

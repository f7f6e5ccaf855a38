"""`tftrain doctor`: an input-bound run (large noise PNGs, a tiny model) and a compute-bound one
(a 64-filter CNN on cached digits), each measured for real; the suggested fix is applied and must
really speed up the doctor's own input-alone measurement. Only ratios with wide margins are
asserted: the machine is shared.
"""
import json

import numpy as np
import pytest

from tftrain import config as config_lib
from tftrain.doctor import advice, measure

STEPS = 30
NOISE_SIZE = 160
TRAINED_SIZE = 32


@pytest.fixture(scope="module")
def noise_pngs(tmp_path_factory):
    """160 random-noise 160x160 RGB PNGs in two classes, converted by the image_folder pipeline
    to be trained on at 32x32 (stored large, trained small, as photos often are).

    Noise does not compress, so each image is ~77 KB of PNG: decoding and resizing it dominate
    the input, while its decoded 32x32 copy is small to keep in memory.
    """
    from PIL import Image

    from pipelines import load_pipeline
    from tftrain.data.writer import write_dataset

    root = tmp_path_factory.mktemp("noise")
    rng = np.random.default_rng(0)
    for index in range(160):
        folder = root / "images" / ("a" if index % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (NOISE_SIZE, NOISE_SIZE, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{index:03d}.png")
    write_dataset(load_pipeline("image_folder", image_size=str(TRAINED_SIZE)), str(root / "images"),
                  str(root / "data"))
    return str(root / "data")


def pooled(input_shape, outputs):
    """A model that costs almost nothing: the mean of each channel, then the output layer."""
    import tf_keras as keras

    from tftrain.models import as_output_spec

    inputs = keras.Input(shape=input_shape)
    return keras.Model(inputs, as_output_spec(outputs).head(
        keras.layers.GlobalAveragePooling2D()(inputs)))


def _run(overrides: str):
    from tftrain import doctor

    return doctor.run(config_lib.build_config("digits", {}, overrides), STEPS)


def test_input_bound_run_gets_a_fix_that_really_speeds_up_its_input(noise_pngs):
    overrides = (f"data.dir={noise_pngs},data.pipeline=image_folder,data.batch_size=32,"
                 "data.shuffle_buffer=64,model.name=tests.test_doctor:pooled,model.params={}")
    result = _run(overrides)
    rates = result["examples_per_second"]
    assert result["verdict"] == advice.INPUT_BOUND, rates
    assert rates["model_alone"] >= 2 * rates["input_alone"], rates  # decoding is the limit
    assert result["costliest_stage"] == "decode", result["stages"]
    fix = result["suggestions"][0]
    assert fix["change"] == "data.cache=decoded" and fix["for_input"], result["suggestions"]
    assert fix["speedup"] >= advice.HELPS
    # tf.data's autotuning off is tried too, and suggested exactly when it helped
    (autotune,) = [t for t in result["tried"] if t["change"] == advice.AUTOTUNE_OFF]
    suggested = [s for s in result["suggestions"] if s["change"] == advice.AUTOTUNE_OFF]
    assert bool(suggested) == (autotune["speedup"] >= advice.HELPS), result["tried"]

    fixed = _run(f"{overrides},{fix['change']}")
    assert fixed["examples_per_second"]["input_alone"] >= 2 * rates["input_alone"], (
        fixed["examples_per_second"], rates)


def test_compute_bound_run_says_so_and_suggests_nothing_for_the_input(digits_dir, tmp_path, cli,
                                                                      capsys):
    out = tmp_path / "doctor.json"
    code = cli("doctor", "--config=digits", f"--steps={STEPS}", f"--json={out}",
               f"--params_override=data.dir={digits_dir},data.cache=decoded,"
               "model.params={filters: [64, 64], dense_units: 128, dropout: 0.0}")
    assert code == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    rates = result["examples_per_second"]
    assert result["verdict"] == advice.COMPUTE_BOUND, rates
    assert rates["input_alone"] >= 3 * rates["model_alone"], rates
    assert not [s for s in result["suggestions"] if s["for_input"]], result["suggestions"]
    assert "verdict: compute-bound" in printed and "| input alone" in printed
    assert result["data_dir"] == digits_dir and result["steps"] == STEPS
    # MFU of the measured rates, and what holds it down (not the input: compute-bound).
    usage = result["utilization"]
    assert usage["mfu"] == pytest.approx(usage["model_flops_per_example"] * rates["combined"]
                                         / usage["peak_flops_per_second"], rel=1e-3)
    assert 0 < usage["mfu"] <= usage["mfu_model_alone"] * 1.25 < 1.25
    assert not [why for why in usage["held_down_by"] if why.startswith("input")]
    assert "model FLOPs utilization: " in printed and "(model alone)" in printed


def test_verdict_margin():
    assert advice.verdict(measure.Rates(100.0, 125.0, 90.0)) == advice.INPUT_BOUND
    assert advice.verdict(measure.Rates(100.0, 124.0, 90.0)) == advice.COMPUTE_BOUND
    assert measure.Rates(100.0, 200.0, 50.0).input_wait == pytest.approx(0.75)


def test_missing_dataset_is_one_line_and_a_nonzero_exit(tmp_path, cli, capsys):
    code = cli("doctor", "--config=digits", f"--params_override=data.dir={tmp_path / 'none'}")
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    assert len(err) == 1 and "none" in err[0]
    assert err[0].startswith("tftrain doctor: error: data.dir=")
    assert not (tmp_path / "none").exists()


def test_bad_config_is_one_line(cli, capsys):
    code = cli("doctor", "--config=digits", "--params_override=data.cahce=decoded")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "data.cache" in err[0]


def test_what_holds_a_cpu_runs_precision_down_follows_its_16_bit_units(monkeypatch):
    from tftrain import host
    from tftrain.doctor import precision_holds

    def holds(overrides, policy, device="CPU"):
        config = config_lib.build_config("digits", {}, ",".join(overrides))
        return precision_holds(config, policy, device)

    monkeypatch.setattr(host, "cpu_flags", lambda: {"avx2", "fma"})  # this VM's kind of CPU
    (held,) = holds(["runtime.mixed_precision=mixed_bfloat16"], "mixed_bfloat16")
    assert "no 16-bit matmul units" in held and "mixed_precision=float32" in held
    assert holds(["runtime.jit_compile=true"], "float32") == []
    monkeypatch.setattr(host, "cpu_flags", lambda: {"avx512_bf16", "amx_bf16"})  # an AMX CPU
    (idle,) = holds([], "float32")
    assert "idle" in idle and "amx_bf16" in idle
    assert holds(["runtime.mixed_precision=mixed_bfloat16"], "mixed_bfloat16") == []
    (xla,) = holds(["runtime.mixed_precision=mixed_bfloat16", "runtime.jit_compile=true"],
                   "mixed_bfloat16")
    assert "XLA" in xla and "jit_compile=auto" in xla
    assert holds([], "float32", "GPU")[0].startswith("precision: float32")

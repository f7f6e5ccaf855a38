"""`tftrain doctor`: an input-bound run (a tiny model on examples whose decoding is a fixed,
large amount of work) and a compute-bound one (the digits config's CNN on its decoded cache),
each measured for real. Each is built lopsided (the slow part costs many times the rest), and the test checks
what the doctor concludes from its measurements (the verdict, the costliest stage, the suggested
fix) and relations that hold by construction; never a speed ratio, which depends on the load of
the (shared) machine.
"""
import json

import pytest
import tensorflow as tf

from tests import documented, test_convert
from tests.test_documented_commands import with_override
from tftrain import config as config_lib
from tftrain.doctor import advice, measure

STEPS = 30
SIZE = 64  # decoded examples are SIZE x SIZE x 1 images ...
WORK_MATMULS = 64  # ... computed by this many SIZE x SIZE matrix products each


class Pipeline(test_convert.Pipeline):
    """test_convert's rows (a number and a label: tiny records, cheap to read and parse),
    decoded by a fixed amount of work, WORK_MATMULS matrix products per example, into an image
    (`data.pipeline=tests.test_doctor`). Decoding costs many times reading and parsing, and
    many times a step of `pooled` per example; keeping the decoded examples in memory
    (data.cache=decoded) skips all of it."""

    name = "tests.test_doctor"

    def decode(self, features, info):
        x = tf.cast(features["x"], tf.float32)[:, None, None]
        image = tf.ones([1, SIZE, SIZE]) * x / self.n  # [batch, SIZE, SIZE], values in [0, 1)
        mean = tf.fill([SIZE, SIZE], 1.0 / SIZE)  # keeps the values where they are
        for _ in range(WORK_MATMULS):
            image = tf.linalg.matmul(image, mean)
        return image[..., None], features["label"]


@pytest.fixture(scope="module")
def costly_decode(tmp_path_factory):
    """A dataset of 256 rows (~200 to train on) of `Pipeline`."""
    from tftrain.data.writer import write_dataset

    path = str(tmp_path_factory.mktemp("doctor") / "data")
    write_dataset(Pipeline(n=256), "", path, workers=1)
    return path


def pooled(input_shape, outputs):
    """A model that costs almost nothing: the mean of each channel, then the output layer."""
    import tf_keras as keras

    from tftrain.models import as_output_spec

    inputs = keras.Input(shape=input_shape)
    return keras.Model(inputs, as_output_spec(outputs).head(
        keras.layers.GlobalAveragePooling2D()(inputs)))


def _config(overrides: str):
    return config_lib.build_config("digits", {}, overrides)


def _run(overrides: str):
    from tftrain import doctor

    return doctor.run(_config(overrides), STEPS)


def test_input_bound_run_names_decode_and_gets_the_cache_that_skips_it(costly_decode):
    overrides = (f"data.dir={costly_decode},data.pipeline=tests.test_doctor,data.eval_split=test,"
                 "data.batch_size=32,data.shuffle_buffer=64,model.name=tests.test_doctor:pooled,"
                 "model.params={}")
    result = _run(overrides)
    rates = result["examples_per_second"]
    assert result["verdict"] == advice.INPUT_BOUND, rates
    stages = {stage["name"]: stage for stage in result["stages"]}
    assert list(stages) == ["read", "parse", "decode", "augment", "transfer"]
    assert result["costliest_stage"] == "decode", result["stages"]
    assert sum(stage["share"] or 0 for stage in stages.values()) == pytest.approx(1)
    fix = result["suggestions"][0]
    assert fix["change"] == "data.cache=decoded" and fix["for_input"], result["suggestions"]
    # The doctor tried it on the run's input alone, and suggests it for what it measured.
    (cache,) = [t for t in result["tried"] if t["change"] == fix["change"]]
    assert cache["measured"] == "input alone" and cache["before"] == rates["input_alone"]
    assert fix["speedup"] == cache["speedup"] == cache["after"] / cache["before"] >= advice.HELPS
    # tf.data's autotuning off is tried too, and suggested exactly when it helped
    (autotune,) = [t for t in result["tried"] if t["change"] == advice.AUTOTUNE_OFF]
    suggested = [s for s in result["suggestions"] if s["change"] == advice.AUTOTUNE_OFF]
    assert bool(suggested) == (autotune["speedup"] >= advice.HELPS), result["tried"]
    # The change as written configures the very input the doctor measured it on.
    fixed = _config(f"{overrides},{fix['change']}")
    assert measure.training_kwargs(fixed) == measure.training_kwargs(_config(overrides),
                                                                     cache="decoded")


def test_compute_bound_run_says_so_and_suggests_nothing_for_the_input(digits_dir, tmp_path, cli,
                                                                      capsys, monkeypatch):
    """The check guide's doctor command as written (digits' CNN on the decoded cache), but
    for the session's digits and STEPS timed steps."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "doctor.json"
    args = documented.args("tftrain doctor --config=digits --params_override=data.cache=decoded "
                           "--json=doctor.json")
    code = cli(*with_override(args, f"data.dir={digits_dir}"), f"--steps={STEPS}")
    assert code == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    rates = result["examples_per_second"]
    assert result["verdict"] == advice.COMPUTE_BOUND, rates
    assert not [s for s in result["suggestions"] if s["for_input"]], result["suggestions"]
    assert "verdict: compute-bound" in printed and "| input alone" in printed
    assert result["data_dir"] == digits_dir and result["steps"] == STEPS
    assert result["input_wait"] == pytest.approx(
        min(1, max(0, 1 - rates["combined"] / rates["model_alone"])))
    # MFU of the measured rates, and what holds it down (not the input: compute-bound).
    usage = result["utilization"]
    for mfu, rate in ((usage["mfu"], rates["combined"]),
                      (usage["mfu_model_alone"], rates["model_alone"])):
        assert mfu == pytest.approx(usage["model_flops_per_example"] * rate
                                    / usage["peak_flops_per_second"], rel=1e-3)
        assert 0 < mfu <= 1  # a CPU peak that a measured rate exceeds is measured again, raised
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


def test_the_augment_stage_is_timed_and_named_when_it_is_the_costliest(digits_dir):
    """With data.augment the augment stage is timed as a stage of its own (the pipeline that
    stops after the decode, then the whole one); the advice for a costliest augment stage
    names it."""
    import dataclasses
    import types

    from tftrain.data import manifest as manifest_lib
    from tftrain.doctor import stages as stages_lib

    config = _config(f"data.dir={digits_dir},data.batch_size=32,"
                     "data.augment={random_resized_crop: true, flip: true}")
    stages = stages_lib.measure_stages(types.SimpleNamespace(device_type="CPU"), config, 5)
    assert [stage.name for stage in stages] == ["read", "parse", "decode", "augment", "transfer"]
    (augment,) = [stage for stage in stages if stage.name == "augment"]
    assert augment.rate > 0 and augment.seconds_per_example >= 0 and not augment.note
    plain = stages_lib.measure_stages(types.SimpleNamespace(device_type="CPU"),
                                      _config(f"data.dir={digits_dir},data.batch_size=32"), 5)
    assert plain[3].rate is None and plain[3].note == stages_lib.NO_AUGMENTATION
    costliest = [dataclasses.replace(stage, seconds_per_example=1.0) if stage.name == "augment"
                 else stage for stage in stages]
    manifest = manifest_lib.typed(manifest_lib.read(digits_dir))
    changes = [s.change for s in advice.input_text(config, manifest, costliest)]
    assert changes[0] == "a lighter data.augment", changes
    assert advice.input_text(config, manifest, costliest)[0].why.startswith("augment is ")

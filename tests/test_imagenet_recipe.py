"""configs/imagenet_resnet50.yaml's header commands as written, on TFRecords in the ImageNet
layout (tests/imagenet_layout.py: JPEGs of varied sizes, 1-based labels, bbox features, no
dataset.json) written in place of the user's /data/imagenet. Changed only: the generated data's
directory and runs/ under the test's directory, the batch (8: the split holds 72 examples, not
1.28 million) and 2 steps; quantize calibrates on 8 examples and measures one batch. ResNet-50 at
224 on 1001 classes learns nothing in 2 steps: what is asserted is that every command runs the
recipe as configured and that they agree with each other."""
import json
import math

import pytest

from tests import documented, imagenet_layout
from tests.conftest import run_cli
from tests.test_documented_commands import assert_check_passes

SMALLER = "data.batch_size=8,train.steps=2"


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """(working directory, records directory): the records written once, read-only."""
    home = tmp_path_factory.mktemp("imagenet_recipe")
    return home, imagenet_layout.write(str(home / "imagenet"))


def _as_user(arguments: list[str], records: str, more: str = "") -> list[str]:
    """A command's `arguments` with the generated records for /data/imagenet (and `more`
    overrides appended to its --params_override)."""
    out = []
    for arg in arguments:
        arg = arg.replace("/data/imagenet", records)
        if arg.startswith("--params_override=") and more:
            arg += "," + more
        out.append(arg)
    return out


@pytest.fixture(scope="module")
def recipe_run(user):
    home, records = user
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(home)
        assert run_cli(*_as_user(documented.args(
            "tftrain train --config=imagenet_resnet50 --model_dir=runs/resnet50 "
            "--params_override=data.dir=/data/imagenet"), records, SMALLER)) == 0
    return home / "runs" / "resnet50"


def test_the_run_trains_the_recipe_as_configured(recipe_run):
    params = (recipe_run / "params.yaml").read_text()
    for setting in ("label_smoothing: 0.1", "random_resized_crop: true", "flip: true",
                    "lr_base_batch_size: 256", "warmup_epochs: 5", "weight_decay: 0.0001",
                    "mixed_precision: mixed_bfloat16", "backbone: ResNet50"):
        assert setting in params, setting
    summary = json.loads((recipe_run / "summary.json").read_text())
    assert summary["eval"]["split"] == "validation"
    for key in ("accuracy", "top5_accuracy", "loss"):
        assert math.isfinite(summary["eval"][key]), key
    assert summary["eval"]["top5_accuracy"] >= summary["eval"]["accuracy"]
    # 1001 classes: an untrained model's loss is near ln(1001) = 6.9, not that of 4 classes
    assert 5.5 < summary["eval"]["loss"] < 8.5


def test_evaluate_and_quantize_as_the_header_shows(recipe_run, user, cli, capsys):
    home, records = user
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(home)
        assert cli(*_as_user(documented.args(
            "tftrain evaluate --model=runs/resnet50/export"), records)) == 0
        result = json.loads((recipe_run / "eval_validation.json").read_text())
        summary = json.loads((recipe_run / "summary.json").read_text())["eval"]
        assert result["num_examples"] == 3 * imagenet_layout.PER_CLASS["validation"]
        for key in ("accuracy", "top5_accuracy"):
            assert result[key] == pytest.approx(summary[key], abs=1e-6), key
        capsys.readouterr()
        assert cli(*_as_user(documented.args(
            "tftrain quantize --model_dir=runs/resnet50 --mode=int8"), records),
            "--num_calibration_examples=8", "--steps=1") == 0
    report = json.loads((recipe_run / "quantized" / "report_int8.json").read_text())
    assert report["split"] == "validation"
    assert (recipe_run / "quantized" / "model_int8.tflite").stat().st_size < 30e6  # int8: ~26 MB


@pytest.mark.parametrize("target", ["tpu", "gpu"])
def test_check_passes_for_the_claimed_targets(target, user, capfd, cli):
    commands = {"tpu": documented.args("tftrain check --config=imagenet_resnet50 --target=tpu "
                                       "--params_override=data.dir=/data/imagenet"),
                "gpu": documented.args("tftrain check --config=imagenet_resnet50 --target=gpu "
                                       "--params_override=data.dir=/data/imagenet")}
    home, records = user
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(home)
        capfd.readouterr()
        assert cli(*_as_user(commands[target], records, "data.batch_size=16")) == 0
    out, err = capfd.readouterr()
    assert_check_passes(out, err, target)

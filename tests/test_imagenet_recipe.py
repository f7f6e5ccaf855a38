"""configs/imagenet_resnet50.yaml's header commands as written, on TFRecords in the ImageNet
layout (tests/imagenet_layout.py: JPEGs of varied sizes, 1-based labels, bbox features, no
dataset.json) written in place of the user's /data/imagenet. Changed only: the generated data's
directory and runs/ under the test's directory, the batch (8: the split holds 72 examples, not
1.28 million), 2 steps, and 64x64 images instead of 224x224 (the generated JPEGs are 20..40
pixels a side; the model is the same ResNet-50, and a test's CPU is the suite's budget);
quantize calibrates on 8 examples and measures one batch. ResNet-50 on 1001 classes learns
nothing in 2 steps: what is asserted is that every command runs the recipe as configured and
that they agree with each other. `tftrain check` at 224: tests/test_imagenet_recipe_check.py."""
import json
import math

import pytest

from tests import documented, imagenet_layout
from tests.conftest import run_cli

SMALLER = ("data.batch_size=8,train.steps=2,data.pipeline_options={image_size: 64},"
           "model.params.image_size=64")


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
                    "image_size: 64",
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

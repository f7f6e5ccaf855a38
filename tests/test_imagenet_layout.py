"""A run on TFRecords in the ImageNet layout (tests/imagenet_layout.py), and every command that
works on it: each reads the run's whole data section from its params.yaml (format, pipeline,
options, info) and measures the run's test split (here `validation`) unless told otherwise."""
import json
from pathlib import Path

import pytest

from tests import imagenet_layout
from tests.conftest import run_cli

TRAINING = {"data.batch_size": 16, "train.epochs": 8, "train.learning_rate": 0.01,
            "model.params": "{filters: [8, 16], dense_units: 16}"}
VALIDATION_EXAMPLES = 3 * imagenet_layout.PER_CLASS["validation"]


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> str:
    """The ImageNet-layout records, written once (read-only)."""
    return imagenet_layout.write(str(tmp_path_factory.mktemp("imagenet_layout") / "records"))


@pytest.fixture(scope="module")
def run(records):
    """The run trained once on the records (read-only except for the outputs of the commands
    under test: eval_*.json, pruned/, quantized/)."""
    run = Path(records).parent / "run"
    assert run_cli("train", "--config=digits", f"--model_dir={run}",
                   f"--params_override={imagenet_layout.overrides(records, **TRAINING)}") == 0
    return run


def read(path) -> dict:
    return json.loads(path.read_text())


def test_training_reads_the_records_as_they_are(run):
    summary = read(run / "summary.json")
    assert summary["eval"]["split"] == "validation"
    assert summary["eval"]["accuracy"] >= 0.9  # 3 classes, labels 1..3: chance is 1/3


def test_evaluate_without_data_reads_the_runs_data_and_test_split(run, cli, capsys):
    assert cli("evaluate", f"--model={run}/export") == 0
    assert capsys.readouterr().out.startswith("validation split: ")
    result = read(run / "eval_validation.json")
    assert (result["split"], result["num_examples"]) == ("validation", VALIDATION_EXAMPLES)
    assert result["accuracy"] == pytest.approx(read(run / "summary.json")["eval"]["accuracy"])
    # --split still chooses: the training split, read from the two train-* files
    assert cli("evaluate", f"--model={run}/export", "--split=train") == 0
    assert read(run / "eval_train.json")["num_examples"] == 3 * imagenet_layout.PER_CLASS["train"]


def test_prune_quantize_and_report_measure_the_runs_test_split(run, cli, capsys):
    assert cli("prune", f"--model_dir={run}", "--epochs=1", "--target_sparsity=0.5") == 0
    pruned = read(run / "pruned" / "report.json")
    assert (pruned["split"], pruned["num_examples_after"]) == ("validation", VALIDATION_EXAMPLES)
    capsys.readouterr()
    assert cli("quantize", f"--model_dir={run}", "--mode=int8,dynamic") == 0
    assert "examples measured: 24 per model, split validation" in capsys.readouterr().out
    for mode in ("int8", "dynamic"):
        report = read(run / "quantized" / f"report_{mode}.json")
        assert (report["split"], report["num_examples"]) == ("validation", VALIDATION_EXAMPLES)
        assert report["accuracy"] >= 0.9, mode  # int8 calibrated on the run's own train-* files
    assert cli("report", str(run), f"--output={run.parent / 'report.png'}") == 0
    header = capsys.readouterr().out.splitlines()[0]
    for model in ("float", "pruned", "int8", "dynamic"):
        assert f"| {model} (validation): accuracy, gzip KiB |" in header
    assert "| validation accuracy |" in header  # the run's own evaluation: the same split


def test_the_images_helper_module_is_not_taken_for_a_dataset_kind(records, tmp_path, cli,
                                                                   capsys):
    run = tmp_path / "run"
    assert cli("train", "--config=digits", f"--model_dir={run}", "--params_override="
               + imagenet_layout.overrides(records, **{"data.pipeline": "images"})) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "tftrain train: error: pipeline 'images' is not a dataset kind (pipelines/images.py is "
        "a helper module of the kinds): the kinds are digits, diabetes, image_folder, csv, "
        "numpy, tfds, jsonl, lmdb, text, or an importable module of your own (my_pkg.my_data) "
        "that defines `class Pipeline(pipelines.base.BasePipeline)`; for image TFRecords "
        "(image/encoded, image/class/label) or a folder of images, use image_folder.")
    assert not run.exists()  # refused: no run directory left behind


def test_a_run_directory_is_a_config_for_doctor_and_check(run):
    """`tftrain doctor --config=RUN` (and check, train) builds the config the run trained with:
    its params.yaml, data section whole (doctor itself is tested on configs in test_doctor)."""
    from tftrain import config as config_lib
    from tftrain.engine import run_config

    assert config_lib.resolve_config_path(str(run)) == f"{run}/params.yaml"
    data = config_lib.build_config(str(run)).data
    assert data == run_config.read(str(run)).data
    assert (data.format, data.pipeline, data.pipeline_options, data.info["num_classes"]) == (
        "tfrecord", "image_folder", {"image_size": imagenet_layout.IMAGE_SIZE}, 4)


def test_a_label_past_data_info_classes_names_it_the_split_and_the_fix(records, tmp_path, cli,
                                                                        capsys):
    # labels go to 3 (1-based): 3 classes declared are one too few
    overrides = imagenet_layout.overrides(records, **{"data.info": "{num_classes: 3}",
                                                      "train.epochs": 1})
    assert cli("train", f"--model_dir={tmp_path / 'run'}",
               f"--params_override={overrides}") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tftrain train: error: a label of 3 in split 'train' of {records} is "
                   "outside the 3 classes [0, 3) that data.info={num_classes: 3} declares: set "
                   "data.info.num_classes above the largest label (ImageNet's 1-based labels go "
                   "to 1000: set data.info={num_classes: 1001}), or fix the records"], err

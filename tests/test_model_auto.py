"""`model.name: auto`, which the default config uses: the model that fits the dataset's kind,
said in one log line; the config's model.params that the chosen model does not take (another
model's) are left out, in that line (#41)."""
from __future__ import annotations

import csv
import json
import logging
import random

import pytest
import yaml

from tftrain import config as config_lib
from tftrain import models
from tftrain.tasks import registry


@pytest.fixture(scope="module")
def wine_dir(tmp_path_factory):
    """A wine-like CSV (13 numeric columns, 3 cultivars) converted as a user would."""
    from tests.conftest import run_cli

    work = tmp_path_factory.mktemp("wine")
    rng = random.Random(0)
    with open(work / "wine.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([f"f{i}" for i in range(13)] + ["cultivar"])
        for _ in range(300):
            cultivar = rng.randrange(3)
            writer.writerow([round(rng.gauss(1.5 * cultivar + 0.1 * i, 1.0), 3)
                             for i in range(13)] + [cultivar])
    assert run_cli("convert", "--pipeline=csv", f"--input={work / 'wine.csv'}",
                   f"--output={work / 'data'}", "--pipeline_options=label_column=cultivar") == 0
    return work / "data"


def test_the_default_config_trains_an_mlp_on_a_converted_csv(wine_dir, tmp_path, cli, caplog):
    run = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="absl"):
        assert cli("train", f"--model_dir={run}",
                   f"--params_override=data.dir={wine_dir},train.epochs=3") == 0
    assert ("model.name=auto: mlp, for tabular features; left out model.params filters, "
            "dense_units (another model's)") in caplog.text
    params = yaml.safe_load((run / "params.yaml").read_text())
    assert params["model"] == {"name": "mlp", "params": {"dropout": 0.25}}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval"]["accuracy"] >= 0.6, summary["eval"]  # 3 classes: chance is 1/3


@pytest.mark.parametrize("manifest,task,expected", [
    ({"features": {"image/encoded": {}, "image/class/label": {}}}, "classification", "cnn"),
    ({"features": {"features": {}, "label": {}}}, "regression", "mlp"),
    ({"features": {"tokens": {}}, "info": {"vocab_size": 105}}, "language_model",
     "transformer_lm"),
    ({"features": {"tokens": {}, "label": {}}, "info": {"vocab_size": 900}}, "classification",
     "transformer"),
])
def test_auto_picks_by_the_kind_of_data(manifest, task, expected):
    assert models.choose(manifest, task)[0] == expected


def test_the_default_config_keeps_its_cnn_on_digits(digits_dir):
    config = config_lib.build_config("digits", overrides=f"data.dir={digits_dir}")
    assert config.model.name == "auto"
    with open(f"{digits_dir}/dataset.json") as f:
        resolved, _ = registry.resolve(config, json.load(f))
    assert resolved.model.name == "cnn"
    assert resolved.model.params == {"filters": [32, 64], "dense_units": 128, "dropout": 0.25}


def test_an_explicit_model_keeps_its_params_checked():
    with pytest.raises(Exception, match="has no parameter model.params.filters"):
        config_lib.build_config("digits", overrides="model.name=mlp")


def test_an_explicit_model_that_cannot_take_the_data_is_refused_in_one_line(wine_dir, tmp_path,
                                                                           cli, capsys):
    assert cli("train", f"--model_dir={tmp_path / 'run'}",
               f"--params_override=data.dir={wine_dir},model.name=cnn,model.params={{}}") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tftrain train: error: model.name=cnn cannot take this dataset's inputs (one "
                   "example: shape (13,)); models that can: mlp. Set model.name=auto to take "
                   "the one that fits, or one of those"], err
    assert not (tmp_path / "run" / "export").exists()

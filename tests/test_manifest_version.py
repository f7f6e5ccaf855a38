"""dataset.json's format version: a newer one is refused in one line naming both versions and
the upgrade; fields this version does not know are read, with a warning naming them."""
import json
import shutil

import pytest

import tftrain
from tftrain.data import manifest as manifest_lib


@pytest.fixture
def dataset(digits_dir, tmp_path):
    path = tmp_path / "digits"
    shutil.copytree(digits_dir, path)
    return path


def rewrite(dataset, **fields) -> str:
    path = dataset / "dataset.json"
    manifest = json.loads(path.read_text())
    manifest.update(fields)
    path.write_text(json.dumps(manifest))
    return str(path)


@pytest.mark.parametrize("fields", [{"version": 99, "shiny_new_field": {"a": 1}},
                                    {"format": "tftrain.dataset/99"}])
def test_a_newer_format_version_is_refused_before_anything_trains(dataset, tmp_path, fields, cli,
                                                                   capsys):
    path = rewrite(dataset, **fields)
    run = tmp_path / "run"
    assert cli("train", "--config=digits", f"--model_dir={run}",
               f"--params_override=data.dir={dataset}") == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"tftrain train: error: {path} is dataset format version 99 (written by tftrain "
        f"{tftrain.__version__}), newer than this tftrain {tftrain.__version__} reads (version "
        "1): upgrade tftrain (pip install --upgrade tftrain), or convert the data again with "
        "this one.")
    assert not run.exists()


def test_fields_this_version_does_not_know_are_read_with_a_warning(dataset, cli, caplog):
    path = rewrite(dataset, shiny_new_field=[1, 2], zeta={})
    assert cli("inspect", f"--data={dataset}", "--verify") == 0
    warnings = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert len(warnings) == 1  # once, however often the manifest is read
    assert warnings[0] == (
        f"{path} has field(s) that this tftrain {tftrain.__version__} does not know: "
        "'shiny_new_field', 'zeta'; read as dataset format version 1, which they do not change "
        "(a later tftrain adds fields only within a version)")


def test_every_field_a_conversion_writes_is_known(digits_dir):
    assert set(json.loads(open(f"{digits_dir}/dataset.json").read())) <= manifest_lib.FIELDS
    assert manifest_lib.FORMAT == f"tftrain.dataset/{manifest_lib.VERSION}"

"""Symlinks and planted claims never make tftrain delete or write outside the directory it was
given (issue #23, defect 1): one deletion rule (`fileio.remove`), and ownership that a link or
a marker alone cannot prove."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.test_output_ownership import one_error_line, snapshot, tiny_run_flags
from tftrain import dir_lock, fileio, ownership, run_dir
from tftrain.errors import TftrainError


@pytest.fixture
def sentinel(tmp_path):
    """A directory outside every target, with files, that must never change."""
    path = tmp_path / "sentinel"
    (path / "sub").mkdir(parents=True)
    (path / "keep.txt").write_text("precious")
    (path / "sub/deep.txt").write_text("also precious")
    (path / "train-00000-of-00001.tfrecord").write_bytes(b"not yours")
    return path


def unchanged(sentinel, before):
    assert snapshot(sentinel) == before


# ---- the rule --------------------------------------------------------------------------------

def test_remove_unlinks_a_link_and_never_its_target(tmp_path, sentinel):
    before = snapshot(sentinel)
    base = tmp_path / "base"
    base.mkdir()
    os.symlink(sentinel, base / "to_dir")
    os.symlink(sentinel / "keep.txt", base / "to_file")
    os.symlink(tmp_path / "nowhere", base / "dangling")
    for name in ("to_dir", "to_file", "dangling"):
        fileio.remove(str(base / name), within=str(base))
        assert not os.path.lexists(base / name)
    unchanged(sentinel, before)


def test_remove_of_a_tree_does_not_follow_links_inside_it(tmp_path, sentinel):
    before = snapshot(sentinel)
    tree = tmp_path / "base/tree"
    (tree / "a").mkdir(parents=True)
    (tree / "a/file").write_text("x")
    os.symlink(sentinel, tree / "a/out")
    fileio.remove(str(tree), within=str(tmp_path / "base"))
    assert not tree.exists()
    unchanged(sentinel, before)


def test_remove_refuses_paths_that_lead_out_of_the_directory(tmp_path, sentinel):
    before = snapshot(sentinel)
    base = tmp_path / "base"
    base.mkdir()
    os.symlink(sentinel, base / "linked_parent")
    for path in (f"{base}/../sentinel/keep.txt", str(sentinel / "keep.txt"),
                 f"{base}/linked_parent/keep.txt", str(base)):
        with pytest.raises(TftrainError, match="is not inside"):
            fileio.remove(path, within=str(base))
    unchanged(sentinel, before)


def test_a_planted_lock_file_link_is_refused_not_written_through(tmp_path, sentinel):
    before = snapshot(sentinel)
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(sentinel / "keep.txt", out / dir_lock.CONVERT_LOCK)
    with pytest.raises(TftrainError, match="is not tftrain's lock file"):
        dir_lock.acquire(str(out), dir_lock.CONVERT_LOCK, "tftrain convert")
    unchanged(sentinel, before)


# ---- dataset directories ---------------------------------------------------------------------

def test_convert_overwrite_of_a_dataset_whose_shard_links_to_a_directory(
        tmp_path, sentinel, digits_dir, cli, capsys):
    before = snapshot(sentinel)
    data = tmp_path / "ds"
    assert cli("convert", "--pipeline=digits", f"--output={data}") == 0
    shard = next(data.glob("train-*.tfrecord"))
    shard.unlink()
    os.symlink(sentinel, shard)
    assert cli("convert", "--pipeline=digits", f"--output={data}", "--overwrite") == 1
    line = one_error_line(capsys.readouterr().err)
    assert f"{shard} was not written by tftrain" in line
    unchanged(sentinel, before)
    assert os.path.islink(shard)


def test_a_planted_marker_cannot_claim_a_link_or_a_folder(tmp_path, sentinel, cli):
    before = snapshot(sentinel)
    out = tmp_path / "out"
    (out / "photos").mkdir(parents=True)
    (out / "photos/cat.jpg").write_bytes(b"meow")
    os.symlink(sentinel, out / "train-00000-of-00001.tfrecord")
    os.symlink(sentinel / "keep.txt", out / "bad_rows.jsonl")
    (out / ownership.CONVERT_MARKER).write_text(json.dumps({
        "format": ownership.CONVERT_FORMAT, "run_id": "x", "pid": 1,
        "files": ["photos", "train-00000-of-00001.tfrecord", "bad_rows.jsonl", "../sentinel"]}))
    contents = ownership.dataset_contents(str(out))
    assert contents.mine == {ownership.CONVERT_MARKER}
    assert {"photos", "train-00000-of-00001.tfrecord", "bad_rows.jsonl"} <= contents.foreign
    # The conversion refuses the entries that collide with its names and deletes nothing.
    assert cli("convert", "--pipeline=digits", f"--output={out}") == 1
    assert (out / "photos/cat.jpg").read_bytes() == b"meow"
    unchanged(sentinel, before)


@pytest.mark.parametrize("valid", [True, False], ids=["valid_manifest", "unreadable_manifest"])
def test_a_planted_manifest_cannot_claim_a_folder_of_the_user(tmp_path, cli, capsys, valid):
    out = tmp_path / "out"
    (out / "photos").mkdir(parents=True)
    (out / "photos/cat.jpg").write_bytes(b"meow")
    shard = {"file": "photos", "num_examples": 0}
    if valid:  # everything a manifest check asks for: the manifest itself is taken as tftrain's
        shard.update(bytes=0, sha256="0" * 64)
    (out / "dataset.json").write_text(json.dumps({
        "format": "tftrain.dataset/1", "pipeline": "digits", "features": {}, "splits": {
            "train": {"num_examples": 0, "shards": [shard]}}}))
    contents = ownership.dataset_contents(str(out))
    assert (contents.manifest is not None) == valid
    assert "photos" in contents.foreign
    code = cli("convert", "--pipeline=digits", f"--output={out}", "--overwrite")
    assert (out / "photos/cat.jpg").read_bytes() == b"meow"
    if valid:  # replaced by the new dataset, written beside the folder it claimed
        assert code == 0
        listed = ownership.dataset_contents(str(out)).listed()
        assert "photos" not in listed and len(listed) == 4, listed  # dataset.json, 3 shards
    else:  # a dataset.json tftrain cannot read is not its own: never replaced
        assert code == 1
        assert f"{out / 'dataset.json'} was not written by tftrain" in one_error_line(
            capsys.readouterr().err)


def test_convert_into_an_existing_file_is_one_line(tmp_path, cli, capsys):
    target = tmp_path / "a_file"
    target.write_text("mine")
    assert cli("convert", "--pipeline=digits", f"--output={target}") == 1
    assert "exists and is not a directory" in one_error_line(capsys.readouterr().err)
    assert target.read_text() == "mine"


# ---- run directories -------------------------------------------------------------------------

def test_train_overwrite_on_a_run_whose_logs_link_elsewhere(tmp_path, sentinel, digits_dir, cli,
                                                            capsys):
    before = snapshot(sentinel)
    model_dir = tmp_path / "run"
    assert cli("train", f"--model_dir={model_dir}", tiny_run_flags(digits_dir)) == 0
    shutil.rmtree(model_dir / "logs")
    os.symlink(sentinel, model_dir / "logs")
    assert cli("train", f"--model_dir={model_dir}", "--overwrite", tiny_run_flags(digits_dir)) == 1
    assert f"{model_dir}/logs was not written by tftrain" in one_error_line(
        capsys.readouterr().err)
    unchanged(sentinel, before)


def test_an_unfinished_run_whose_backup_links_elsewhere(tmp_path, sentinel):
    """The finish step (which deletes backup/) and the claim never reach a link's target."""
    before = snapshot(sentinel)
    model_dir = tmp_path / "run"
    run_dir.prepare(str(model_dir), overwrite=False)
    run_dir.release(str(model_dir))
    (model_dir / "params.yaml").write_text("data: {}\n")
    os.symlink(sentinel, model_dir / "backup")
    assert "backup" in run_dir.contents(str(model_dir)).foreign
    with pytest.raises(TftrainError, match="backup was not written by tftrain"):
        run_dir.prepare(str(model_dir), overwrite=False)
    run_dir.finish(str(model_dir), {"epochs": 0})  # even when called, only the link goes
    assert not os.path.lexists(model_dir / "backup")
    unchanged(sentinel, before)

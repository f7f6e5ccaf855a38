"""`tftrain convert --append`, through the CLI: new shards beside untouched old ones, one
manifest for both, the dataset's vocabulary and classes kept; what would change them refused
in one line, leaving the dataset as it was."""
import hashlib
import json
import os

import pytest

from tests import forked_cli
from tests.conftest import REPO
from tests.test_pipeline_jsonl import make_lines, write_jsonl


def tftrain(*args, cwd=REPO):
    return forked_cli.run(list(args), cwd=cwd, timeout=300)


def fingerprints(directory) -> dict:
    """{name: sha256} of every file in `directory` but the conversion lock (its pid changes)."""
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
            for name in sorted(os.listdir(directory))
            if (directory / name).is_file() and name != ".convert.lock"}


@pytest.fixture
def reviews(tmp_path):
    """A jsonl dataset of 400 reviews, converted as a user converts it."""
    write_jsonl(tmp_path / "first.jsonl", make_lines(400, seed=0))
    done = tftrain("convert", "--pipeline=jsonl", f"--input={tmp_path / 'first.jsonl'}",
                   f"--output={tmp_path / 'data'}", "--num_shards=2",
                   "--pipeline_options=max_length=16")
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp_path / "data"


def test_append_adds_shards_and_keeps_the_old_files(reviews, tmp_path):
    (reviews / "notes.txt").write_text("a file tftrain did not write")
    before = fingerprints(reviews)
    old = json.loads((reviews / "dataset.json").read_text())
    write_jsonl(tmp_path / "more.jsonl", make_lines(300, seed=1))
    done = tftrain("convert", "--pipeline=jsonl", f"--input={tmp_path / 'more.jsonl'}",
                   f"--output={reviews}", "--append", "--num_shards=1",
                   "--pipeline_options=max_length=16")
    assert done.returncode == 0, done.stderr[-2000:]
    after = fingerprints(reviews)
    for name, digest in before.items():  # the old shards and the user's file, byte for byte
        if name.endswith(".tfrecord") or name == "notes.txt":
            assert after[name] == digest, name
    new = json.loads((reviews / "dataset.json").read_text())
    total = sum(s["num_examples"] for s in new["splits"].values())
    assert total == 700 and new["info"]["vocabulary"] == old["info"]["vocabulary"]
    added = [s["file"] for split in new["splits"].values() for s in split["shards"]
             if "-g001-" in s["file"]]
    assert added and all((reviews / name).is_file() for name in added)
    assert new["appends"][0]["examples"] == 300
    assert tftrain("inspect", f"--data={reviews}", "--verify").returncode == 0
    from tftrain.data import reader

    read = sum(int(labels.shape[0]) for split in new["splits"]
               for _, labels in reader.load(str(reviews), split, 64, training=False))
    assert read == 700


def test_a_class_the_dataset_lacks_is_refused_and_nothing_changes(reviews, tmp_path):
    before = fingerprints(reviews)
    lines = make_lines(50, seed=2) + [{"text": "so so film", "label": "meh"}]
    write_jsonl(tmp_path / "odd.jsonl", lines)
    done = tftrain("convert", "--pipeline=jsonl", f"--input={tmp_path / 'odd.jsonl'}",
                   f"--output={reviews}", "--append", "--pipeline_options=max_length=16")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "'meh'" in line and "not among the dataset's 2 classes" in line
    assert fingerprints(reviews) == before


def test_other_options_are_refused(reviews, tmp_path):
    write_jsonl(tmp_path / "more.jsonl", make_lines(50, seed=3))
    done = tftrain("convert", "--pipeline=jsonl", f"--input={tmp_path / 'more.jsonl'}",
                   f"--output={reviews}", "--append")  # max_length 128, not 16
    assert done.returncode == 2 and "info.max_length=16, the new data gives 128" in done.stderr
    done = tftrain("convert", "--pipeline=csv", f"--input={tmp_path / 'more.jsonl'}",
                   f"--output={reviews}", "--append")
    assert done.returncode != 0 and "Traceback" not in done.stderr


def test_a_failed_append_leaves_the_dataset_as_it_was(reviews, tmp_path):
    before = fingerprints(reviews)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(["not json"] * 40 + [json.dumps(r) for r in make_lines(5)]) + "\n")
    done = tftrain("convert", "--pipeline=jsonl", f"--input={bad}", f"--output={reviews}",
                   "--append", "--pipeline_options=max_length=16")
    assert done.returncode == 1 and "left the dataset" in done.stderr, done.stderr
    assert fingerprints(reviews) == before


def test_append_needs_a_dataset_and_not_overwrite(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", make_lines(20))
    done = tftrain("convert", "--pipeline=jsonl", f"--input={tmp_path / 'a.jsonl'}",
                   f"--output={tmp_path / 'none'}", "--append")
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "--append adds to a tftrain dataset" in line and "is not a directory" in line, line
    (tmp_path / "empty").mkdir()
    done = tftrain("convert", "--pipeline=jsonl", f"--input={tmp_path / 'a.jsonl'}",
                   f"--output={tmp_path / 'empty'}", "--append")
    assert done.returncode == 1 and "holds none (no readable dataset.json)" in done.stderr
    assert os.listdir(tmp_path / "empty") == []
    done = tftrain("convert", "--pipeline=jsonl", f"--input={tmp_path / 'a.jsonl'}",
                   f"--output={tmp_path / 'none'}", "--append", "--overwrite")
    assert done.returncode == 2 and "pass one" in done.stderr


def test_append_with_beam_is_refused_in_one_line(reviews, tmp_path):
    before = fingerprints(reviews)
    write_jsonl(tmp_path / "more.jsonl", make_lines(20))
    done = tftrain("convert", "--pipeline=jsonl", f"--input={tmp_path / 'more.jsonl'}",
                   f"--output={reviews}", "--append", "--runner=beam")
    assert done.returncode == 2, done.stderr  # a usage error
    (line,) = done.stderr.strip().splitlines()
    assert "--append runs with --runner=local" in line, line
    assert fingerprints(reviews) == before

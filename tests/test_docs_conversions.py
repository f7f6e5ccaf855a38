"""The `tftrain convert` commands of the reference pages (docs/pipelines.md, docs/tasks.md,
docs/guides/lm-on-gpus.md and `tftrain convert --help`, whose examples docs/reference/cli.md
shows) run as written, on files of the shapes they name (people.csv with a zip code, table.csv,
photos/, books/, a new_reviews.jsonl appended to a converted reviews.jsonl), generated here in
one user's working directory; each command's dataset is checked for what its options promise.
tests/test_docs_commands.py counts `COMMANDS` as run.
"""
import csv
import json
import re
import shlex
import shutil

import pytest

from tests.test_documented_commands import run
from tests.test_docs_commands import COMMANDS_IN_DOCS
from tests.test_own_data_guide import write_books, write_photos, write_reviews

SPLITS = ("train", "validation", "test")
PAGES = ("docs/pipelines.md", "docs/tasks.md", "docs/guides/lm-on-gpus.md",
         "docs/reference/cli.md")
KINDS = ("csv", "image_folder", "jsonl", "text")  # not tfds (the network), lmdb (/data), beam


def conversions() -> list[str]:
    """The convert commands of `PAGES` of the kinds this file runs."""
    return sorted({command for page, command in COMMANDS_IN_DOCS if page in PAGES
                   and command.startswith("tftrain convert ") and "--runner=" not in command
                   and re.search(r"--pipeline=(\w+)", command).group(1) in KINDS})


COMMANDS = conversions()


def write_tables(root) -> None:
    """people.csv (a churn label and a zip code) and table.csv (the iris-like species table)."""
    with open(root / "people.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["age", "zip", "monthly_fee", "churned"])
        for i in range(120):
            rows.writerow([20 + i % 50, f"{75000 + i % 4}", 30 + (i * 7) % 60, int(i % 3 == 0)])
    with open(root / "table.csv", "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["sepal", "petal", "species"])
        for i in range(90):
            rows.writerow([4 + (i % 10) / 10, 1 + (i % 7) / 5, ["setosa", "versicolor",
                                                               "virginica"][i % 3]])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The user's files, written once."""
    root = tmp_path_factory.mktemp("files")
    write_tables(root)
    write_photos(root, per_class=20)
    write_books(root, chars=120_000)
    write_reviews(root, n=200)
    (root / "new_reviews.jsonl").write_text(
        "".join(json.dumps({"text": f"a new review {i} good", "label": "pos"}) + "\n"
                for i in range(40)), encoding="utf-8")
    return root


@pytest.fixture
def user_dir(files, tmp_path):
    """A working directory of its own for each command (two write data/photos) with the user's
    files; for --append, data/reviews converted from reviews.jsonl (what it appends to)."""
    for path in files.iterdir():
        (shutil.copytree if path.is_dir() else shutil.copy)(path, tmp_path / path.name)
    return tmp_path


def test_the_pages_show_the_conversions_run_here():
    assert len(COMMANDS) == 8, COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_a_documented_conversion_runs_as_written(command, user_dir):
    if "--append" in command:
        first = run("tftrain convert --pipeline=jsonl --input=reviews.jsonl "
                    "--output=data/reviews", user_dir)
        assert first.returncode == 0, first.stderr[-2000:]
    result = run(command, user_dir)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    args = dict(arg[2:].split("=", 1) for arg in shlex.split(command)[2:] if "=" in arg)
    manifest = json.loads((user_dir / args["output"] / "dataset.json").read_text())
    counts = {name: split["num_examples"] for name, split in manifest["splits"].items()}
    assert counts.get("train", 0) > 0 and manifest["bad_rows"]["count"] == 0, counts
    assert f"wrote {args['output']}: " in result.stdout, result.stdout
    info = manifest["info"]
    options = dict(option.split("=", 1) for option in args.get("pipeline_options", "").split(",")
                   if option)
    if "image_size" in options:
        assert info["image_size"][:2] == [int(options["image_size"])] * 2, info
    if "splits" in args:
        assert sorted(counts) == sorted(SPLITS) and counts["train"] > 4 * counts["test"], counts
    if "label_column" in options:
        assert info["label"]["name"] == options["label_column"], info
    if "columns" in options:
        name, kind = options["columns"].split(":")
        column = next(c for c in info["columns"] if c["name"] == name)
        assert column["type"] == kind and len(column["vocabulary"]) == 4, column
    if "sequence_length" in options:
        assert manifest["features"]["tokens"]["shape"] == [int(options["sequence_length"]) + 1]
    if options.get("tokenizer") == "sentencepiece":
        assert info["tokenizer"] == "sentencepiece", info
    if "--append" in command:
        assert sum(counts.values()) == 240, counts  # 200 converted before, 40 appended

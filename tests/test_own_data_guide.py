"""docs/guides/own-data.md runs as written: each section's ```sh commands, read from the page,
in order, on files of the shapes it describes (people.csv, photos/, books/, reviews.jsonl),
generated here with fixed seeds in one user's working directory.

Each command runs as a shell runs it (`tests.test_documented_commands.run`: its own process
entering the console script's entry point, forked from a server that imported TensorFlow once);
only a section's training is shortened, by the override its `Section.fewer` gives. What each
command promises is checked (`CHECKS`): the conversion's splits, counts and statistics, inspect's
splits, a test metric no stub reaches, every quantized model within its gate, the int8 model
evaluated alone to its report's accuracy, generated text that continues the prompt; and the
numbers the section states (`Section.claims`). tests/test_docs_commands.py counts these commands
(`guide_commands`) as run.
"""
import csv
import dataclasses
import json
import os
import re
import shlex
from typing import Callable

import numpy as np
import pytest
from PIL import Image

from pipelines.text import embedded_text
from tests.conftest import REPO
from tests.test_documented_commands import run
from tests.test_pipeline_jsonl import make_lines, write_jsonl

GUIDE = os.path.join(REPO, "docs", "guides", "own-data.md")
SPLITS = ("train", "validation", "test")


def guide_text() -> dict[str, str]:
    """{section title: its text} for each `## ` section of the guide."""
    text = open(GUIDE, encoding="utf-8").read()
    return {part.split("\n", 1)[0].strip(): part.split("\n", 1)[1]
            for part in re.split(r"^## ", text, flags=re.MULTILINE)[1:]}


def section_commands(text: str) -> list[str]:
    """The `tftrain` commands of a section's ```sh blocks, in order, each as
    tests/test_docs_commands.py reads it (continuation lines joined, a `# comment` dropped)."""
    commands, in_sh, command = [], False, None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            in_sh = stripped == "```sh" and not in_sh
        elif in_sh and (command is not None or stripped.startswith("tftrain ")):
            command = stripped if command is None else command[:-1].rstrip() + " " + stripped
            if not command.endswith("\\"):
                commands.append(re.sub(r"\s+#\s.*$", "", command))
                command = None
    return commands


def guide_sections() -> dict[str, list[str]]:
    """{section title: its commands} for each section of the guide that shows some."""
    return {title: commands for title, text in guide_text().items()
            if (commands := section_commands(text))}


def guide_commands() -> list[str]:
    """Every command of the guide's ```sh blocks: the ones this file runs as written."""
    return [command for commands in guide_sections().values() for command in commands]


# --- the user's files: what each section describes, seeded ------------------------------------

CITIES = {"lyon": 0.8, "oslo": -0.6, "lima": 0.3, "pune": -0.4}  # each city's pull to churn
HEADER = ["age", "city", "monthly_fee", "tenure_months", "churned"]


def people_rows(n, seed, flipped) -> list[list]:
    """`n` rows of HEADER: churned (0/1) when a linear score of the fee, the tenure and the city
    is positive, a `flipped` share of the labels the other way; rows too close to the boundary
    are drawn again (a gap that int8 rounding does not cross)."""
    rng = np.random.default_rng(seed)
    rows = []
    while len(rows) < n:
        age, city = int(rng.integers(18, 80)), str(rng.choice(list(CITIES)))
        fee, tenure = round(float(rng.uniform(20, 120)), 1), int(rng.integers(1, 73))
        score = (fee - 70) / 25 - (tenure - 30) / 18 + CITIES[city]
        if abs(score) > 0.3:
            rows.append([age, city, fee, tenure, int((score > 0) != (rng.random() < flipped))])
    return rows


def write_people(root, n=500, seed=0, flipped=0.1) -> dict:
    """people.csv as the guide shows it (`people_rows`: people are not a formula; the best a
    model can do is about 0.9), and new_people.csv, what predict reads: 150 other people with
    an id, the columns in another order, no label (the formula's, unflipped, kept here), and
    one row with two fields missing."""
    rows = people_rows(n, seed, flipped)
    with open(root / "people.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER)
        writer.writerows(rows)
    new, truth = people_rows(150, seed + 1, 0.0), {}
    with open(root / "new_people.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "monthly_fee", "city", "tenure_months", "age"])
        for i, (age, city, fee, tenure, churned) in enumerate(new):
            writer.writerow([f"c{i:03d}", fee, city, tenure, age])
            truth[f"new_people.csv:{i + 2}"] = str(churned)
        writer.writerow(["c150", "80.0", "lyon"])
    churned = sum(row[-1] for row in rows) / n
    columns = {name: ("float", float(np.mean([row[i] for row in rows])))
               for i, name in enumerate(HEADER) if name not in ("city", "churned")}
    return {"rows": n, "chance": max(churned, 1 - churned),
            "columns": {**columns, "city": ("categorical", sorted(CITIES))},
            "info": {"header": HEADER, "num_classes": 2,
                     "label": {"name": "churned", "type": "int"}},
            "new": {"rows": 151, "bad": 1, "truth": truth,
                    "passed": {"id": [f"c{i:03d}" for i in range(151)]}}}


PHOTO_CLASSES = {"apple": (200, 40, 40), "leaf": (40, 160, 50), "sky": (60, 110, 220)}


def write_photos(root, per_class=60, seed=0) -> dict:
    """photos/<class>/*.png: 48x40 pictures in a class's colour at a random brightness, shaded
    across and down, with noise (larger than the 32x32 the conversion resizes them to); and
    new_photos/, what predict reads: 40 other pictures of each class, named after it, and a
    damaged one (a PNG cut short)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:40, 0:48]

    def picture(colour, path):
        shade = rng.uniform(0.6, 1.0) * np.array(colour) * (0.7 + 0.3 * xx / 48)[..., None]
        pixels = shade + (yy * rng.uniform(0, 1))[..., None] + rng.normal(0, 12, (40, 48, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path)

    (root / "new_photos").mkdir()
    truth = {}
    for name, colour in PHOTO_CLASSES.items():
        (root / "photos" / name).mkdir(parents=True)
        for i in range(per_class):
            picture(colour, root / "photos" / name / f"{i:03d}.png")
        for i in range(40):
            picture(colour, root / "new_photos" / f"{name}_{i:03d}.png")
            truth[f"new_photos/{name}_{i:03d}.png"] = name
    (root / "new_photos" / "damaged.png").write_bytes(
        (root / "new_photos" / "sky_000.png").read_bytes()[:200])
    return {"rows": per_class * len(PHOTO_CLASSES), "chance": 1 / len(PHOTO_CLASSES),
            "info": {"class_names": sorted(PHOTO_CLASSES), "num_classes": len(PHOTO_CLASSES)},
            "new": {"rows": len(truth) + 1, "bad": 1, "truth": truth}}


def write_books(root, files=4, chars=200_000) -> dict:
    """books/*.txt: the first `chars` characters of the embedded Python documentation
    (English prose and code), cut at line ends into `files` books."""
    lines, books = embedded_text()[:chars].splitlines(keepends=True), root / "books"
    books.mkdir()
    per_book = -(-len(lines) // files)
    for i in range(files):
        (books / f"book{i + 1}.txt").write_text("".join(lines[i * per_book:(i + 1) * per_book]),
                                                encoding="utf-8")
    return {"info": {"num_characters": len("".join(lines))}}


def write_reviews(root, n=600, seed=0) -> dict:
    """reviews.jsonl: {"text", "label"} rows, labelled pos or neg by two of their seven words
    (tests/test_pipeline_jsonl.py's); and new_reviews.txt, what predict reads: 150 other
    reviews, one text per line."""
    rows = make_lines(n, seed)
    write_jsonl(root / "reviews.jsonl", rows)
    new = make_lines(150, seed + 1)
    (root / "new_reviews.txt").write_text("".join(row["text"] + "\n" for row in new))
    positive = sum(row["label"] == "pos" for row in rows) / n
    return {"rows": n, "chance": max(positive, 1 - positive),
            "info": {"class_names": ["neg", "pos"], "num_classes": 2},
            "new": {"rows": 150, "bad": 0, "truth": {f"new_reviews.txt:{i + 1}": row["label"]
                                                     for i, row in enumerate(new)}}}


# --- what each section's commands promise --------------------------------------------------------

def flag(args: list[str], name: str) -> str:
    """The value of `--name=` in a command's arguments."""
    return next(arg.split("=", 1)[1] for arg in args if arg.startswith(f"--{name}="))


def check_convert(args, stdout, cwd, seen) -> None:
    """dataset.json at --output: the three splits by hash, 80/10/10 (train more than twice the
    others), counts that add up to the rows written and that the summary line shows, no bad row,
    the info the files determine, each --pipeline_options value kept, and a table's column types
    and statistics (measured at conversion: the means of the file's numbers)."""
    out = flag(args, "output")
    manifest = json.loads((cwd / out / "dataset.json").read_text())
    counts = {name: split["num_examples"] for name, split in manifest["splits"].items()}
    assert sorted(counts) == sorted(SPLITS) and min(counts.values()) > 0, counts
    assert counts["train"] > 2 * (counts["validation"] + counts["test"]), counts
    assert sum(counts.values()) == seen.get("rows", sum(counts.values())), (counts, seen)
    assert manifest["bad_rows"]["count"] == 0, manifest["bad_rows"]
    wrote = next(line for line in stdout.splitlines() if line.startswith(f"wrote {out}: "))
    assert all(f"{name}={count}" in wrote for name, count in counts.items()), wrote
    info = manifest["info"]
    assert {key: info.get(key) for key in seen["info"]} == seen["info"]
    given = [arg.split("=", 1)[1] for arg in args if arg.startswith("--pipeline_options=")]
    for key, value in (option.split("=", 1) for text in given for option in text.split(",")):
        if key == "image_size":
            assert info[key][:2] == [int(value)] * 2, info[key]
        elif key in info:
            assert str(info[key]) == value, (key, info[key])
    columns = {column["name"]: column for column in info.get("columns", [])}
    assert sorted(columns) == sorted(seen.get("columns", {})), columns
    for name, (kind, statistic) in seen.get("columns", {}).items():
        assert columns[name]["type"] == kind, columns[name]
        if kind == "categorical":
            assert sorted(columns[name]["vocabulary"]) == statistic, columns[name]
        else:
            assert columns[name]["mean"] == pytest.approx(statistic), columns[name]
    seen.update(counts=counts, manifest_info=info)


def check_inspect(args, stdout, cwd, seen) -> None:
    """Each split with the number of examples the conversion wrote."""
    for name, count in seen["counts"].items():
        assert re.search(rf"^  {name}: {count} examples in \d+ shard", stdout, re.M), stdout


def check_train(args, stdout, cwd, seen) -> None:
    """The test split's metric, printed and in summary.json, beyond what a stub reaches."""
    metric = seen["section"].metric
    printed = float(re.search(rf"^test split: .*\b{metric}=(\d+\.\d+)", stdout, re.M).group(1))
    summary = json.loads((cwd / flag(args, "model_dir") / "summary.json").read_text())
    assert summary["eval"]["split"] == "test"
    assert summary["eval"][metric] == pytest.approx(printed, abs=1e-4)
    assert seen["section"].learned(printed, seen), f"{metric}={printed}; {seen}"
    seen[metric] = printed


def check_quantize(args, stdout, cwd, seen) -> None:
    """Each --mode's model written, measured on the test split by the run's metric, and within
    its gate (report_<mode>.json's `passed`)."""
    model_dir = flag(args, "model_dir")
    for mode in flag(args, "mode").split(","):
        report = json.loads((cwd / model_dir / "quantized" / f"report_{mode}.json").read_text())
        assert report["passed"] is True and report["split"] == "test", report
        assert report["measure"] == seen["section"].metric, report
        assert report["num_examples"] == seen["counts"]["test"], report
        assert (cwd / report["tflite_path"]).is_file(), report["tflite_path"]
        assert re.search(rf"^{mode}: \S+model_{mode}\.tflite ", stdout, re.M), stdout
        seen[f"report_{mode}"] = report


def check_evaluate(args, stdout, cwd, seen) -> None:
    """The quantized model evaluated alone: its report's accuracy, on the whole test split."""
    mode = re.fullmatch(r".*/model_(\w+)\.tflite", flag(args, "model")).group(1)
    printed = float(re.search(r"\baccuracy=(\d\.\d+)", stdout).group(1))
    assert printed == pytest.approx(seen[f"report_{mode}"]["accuracy"], abs=1e-4), stdout
    assert f"examples: {seen['counts']['test']} (the whole split)" in stdout, stdout


def check_generate(args, stdout, cwd, seen) -> None:
    """Text that continues the prompt."""
    prompt = flag(args, "prompt")
    assert stdout.startswith(prompt) and len(stdout.strip()) > len(prompt) + 20, stdout


def check_predict(args, stdout, cwd, seen) -> None:
    """One output row per input row, in input order, nothing dropped: the bad rows with their
    reason in `error` and counted in the summary line; the good rows' classes right as often as
    the section's test metric needs (the answers of new rows the model never saw)."""
    output, new = cwd / flag(args, "output"), seen["new"]
    if output.suffix == ".jsonl":
        rows = [json.loads(line) for line in output.read_text().splitlines()]
    else:
        with open(output, newline="") as f:
            rows = list(csv.DictReader(f))
    assert len(rows) == new["rows"], (len(rows), new)
    good = [row for row in rows if not row["error"]]
    assert len(rows) - len(good) == new["bad"], [row for row in rows if row["error"]]
    assert [row["input"] for row in good] == list(new["truth"]), [r["input"] for r in good][:5]
    for column, values in new.get("passed", {}).items():
        assert [row[column] for row in rows] == values, [row[column] for row in rows][:5]
    summary = f"{new['bad']:,} bad" if new["bad"] else "none bad"
    shown = f"predicted {new['rows']:,} rows into {flag(args, 'output')}: {summary}"
    assert shown in stdout, stdout
    accuracy = float(np.mean([row["class"] == new["truth"][row["input"]] for row in good]))
    assert seen["section"].learned(accuracy, seen), (accuracy, seen["chance"])


CHECKS = {"convert": check_convert, "inspect": check_inspect, "train": check_train,
          "quantize": check_quantize, "evaluate": check_evaluate, "generate": check_generate,
          "predict": check_predict}


# --- the sections --------------------------------------------------------------------------------

def csv_claims(text: str, seen: dict) -> None:
    """"test accuracy X here": the accuracy this run measured (within 2 of its 50-odd test rows)."""
    shown = float(re.search(r"test accuracy (\d\.\d+) here", text).group(1))
    assert seen["accuracy"] == pytest.approx(shown, abs=0.04), (shown, seen["accuracy"])


def photos_claims(text: str, seen: dict) -> None:
    """"int8 was Xx the size ... at the same accuracy": the int8 report's size ratio (a property
    of the model, not of the machine; its latency ratio is, and is not checked) and no drop."""
    shown = float(re.search(r"int8 was (\d\.\d+)x the size", text).group(1))
    report = seen["report_int8"]
    assert report["size_ratio"] == pytest.approx(shown, abs=0.01), report["size_ratio"]
    assert "at the same accuracy" in text and report["accuracy_drop"] <= 0, report


@dataclasses.dataclass(frozen=True)
class Section:
    write: Callable[..., dict]  # writes the user's files into a directory: what they determine
    fewer: str | None  # the override that shortens its training; None: as written
    metric: str  # what its `train` prints for the test split and its quantize gates on
    learned: Callable[[float, dict], bool]  # the metric, beyond what a stub reaches?
    claims: Callable[[str, dict], None] = lambda text, seen: None  # the section's numbers


SECTIONS = {
    # 5 of diabetes's 60 epochs (as written: 0.84, for 7 CPU-s more); the majority label: 0.59
    "A CSV table": Section(write_people, "train.epochs=5", "accuracy",
                           lambda accuracy, seen: accuracy >= seen["chance"] + 0.15, csv_claims),
    "A folder of images": Section(write_photos, None, "accuracy",  # as written: 5 short epochs
                                  lambda accuracy, seen: accuracy >= seen["chance"] + 0.5,
                                  photos_claims),
    # 20 of text_lm_subword's 4 x 30 steps: perplexity 271 of a uniform guess's 1024 (a unigram
    # model of these books: 239), 10 steps 591; the export costs most of its CPU either way
    "Text: a language model on your corpus": Section(
        write_books, "train.epochs=1,train.steps_per_epoch=20", "perplexity",
        lambda perplexity, seen: perplexity < seen["manifest_info"]["vocab_size"] / 3),
    # 2 of text_classification's 5 epochs: 1.0 (8 steps: 0.87); sequences of 128 ids (the
    # conversion's default max_length), so each step costs 0.16 CPU-s
    "Text: a classifier": Section(write_reviews, "train.epochs=2", "accuracy",
                                  lambda accuracy, seen: accuracy >= seen["chance"] + 0.35),
}


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    """The user's working directory: each section's files, data/ and runs/ side by side."""
    return tmp_path_factory.mktemp("user")


def test_each_section_with_commands_is_run_here():
    assert list(guide_sections()) == list(SECTIONS)


@pytest.mark.slow
@pytest.mark.parametrize("title", list(SECTIONS))
def test_a_guide_section_runs_as_written(title, user_dir):
    section, text = SECTIONS[title], guide_text()[title]
    seen = {"section": section, **section.write(user_dir)}
    for command in section_commands(text):
        result = run(command, user_dir, fewer=section.fewer)
        output = result.stdout + result.stderr
        assert result.returncode == 0 and "Traceback" not in output, f"{command}\n{output[-3000:]}"
        args = shlex.split(command)
        CHECKS[args[1]](args, result.stdout, user_dir, seen)
    section.claims(text, seen)

"""`tftrain predict` on raw files: the same answers as evaluate's path on the converted records
(a SavedModel and its int8 .tflite), rows passed through, bad rows marked and counted, one line
for each bad input, and no complete-looking output from a killed predict.

Two runs are trained here, each for a few steps (parity does not need a good model, only the
same one): digits written as PNG files into class folders and converted by `image_folder`, and
the own-data guide's people.csv converted by `csv`.
"""
import csv
import json
import os
import shutil
import signal
import time

import numpy as np
import pytest
import tensorflow as tf
import yaml
from PIL import Image

from pipelines import load_pipeline
from tests import forked_cli
from tests.conftest import run_cli
from tests.test_own_data_guide import write_people
from tftrain import data as data_lib
from tftrain.data import manifest as manifest_lib
from tftrain.data.writer import write_dataset
from tftrain.optimize import evaluate, predict, tflite_eval

SMALL_CNN = "model.params={filters: [8], dense_units: 32, dropout: 0.0}"
BOUND = 120  # seconds a forked predict may take to reach a state the test waits for


def write_digit_pngs(root):
    """sklearn's digits as 8x8 grayscale PNGs in <root>/<digit>/<index>.png (as the digits
    pipeline stores them: 0..16 stretched to 0..255)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    for index, (pixels, label) in enumerate(zip(digits.images, digits.target)):
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        image = np.clip(np.rint(pixels * (255.0 / 16.0)), 0, 255).astype(np.uint8)
        Image.fromarray(image).save(folder / f"{index:04d}.png")


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    """(run directory, dataset directory, raw folder): digits PNGs converted by image_folder,
    a small CNN trained for one short epoch, then quantized to int8."""
    root = tmp_path_factory.mktemp("predict_images")
    write_digit_pngs(root / "pngs")
    data = str(root / "data")
    write_dataset(load_pipeline("image_folder"), str(root / "pngs"), data)
    run = root / "run"
    assert run_cli("train", f"--model_dir={run}", "--config=digits", "--params_override="
                   f"data.dir={data},data.pipeline=image_folder,train.epochs=1,"
                   f"train.steps_per_epoch=20,{SMALL_CNN}") == 0
    assert run_cli("quantize", f"--model_dir={run}", "--mode=int8",
                   "--max_accuracy_drop=1") == 0
    return run, data, root / "pngs"


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory):
    """(run directory, dataset directory, the CSV): people.csv converted by csv, diabetes's mlp
    trained for 2 epochs."""
    root = tmp_path_factory.mktemp("predict_csv")
    write_people(root)
    data = str(root / "data")
    write_dataset(load_pipeline("csv", label_column="churned"), str(root / "people.csv"), data)
    run = root / "run"
    assert run_cli("train", f"--model_dir={run}", "--config=diabetes", "--params_override="
                   f"data.dir={data},data.pipeline=csv,train.epochs=2") == 0
    return run, data, root / "people.csv"


def split_records(data, split="test"):
    """The split's serialized records, in file order (the order `tftrain.data.load` reads)."""
    files = manifest_lib.shard_files(data, manifest_lib.read(data), split)
    return list(tf.data.TFRecordDataset(files).as_numpy_iterator())


def evaluate_path(run, data):
    """The probabilities evaluate's path computes on the test split: the Keras model it loads,
    on the batches `tftrain.data.load` decodes, softmaxed as the export's signature does."""
    model = evaluate.load_saved_model(str(run / "export"))
    logits = np.concatenate([model(inputs, training=False).numpy()
                             for inputs, _ in data_lib.load(data, "test", 64, training=False)])
    return tf.nn.softmax(logits).numpy()


def tflite_path(run, data):
    """The probabilities of the int8 model as its own evaluation runs it (one example at a
    time, `tflite_eval.predict_tflite` on `tftrain.data.load`'s batches)."""
    outputs, _, _ = tflite_eval.predict_tflite(
        str(run / "quantized" / "model_int8.tflite"),
        data_lib.load(data, "test", 64, training=False))
    return tf.nn.softmax(outputs.astype(np.float32)).numpy()


def read_output(path):
    if str(path).endswith(".jsonl"):
        return [json.loads(line) for line in open(path, encoding="utf-8")]
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def copy_test_images(data, pngs, destination):
    """The test split's raw files (named in its records' image/filename) copied under
    `destination`, class folders kept; returns their names in record order."""
    names = [tf.train.Example.FromString(record).features.feature["image/filename"]
             .bytes_list.value[0].decode() for record in split_records(data)]
    for name in names:
        (destination / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(pngs / name, destination / name)
    return names


def assert_same_answers(rows, names, probabilities, classes):
    """Each output row (by its input, one of `names`) has the class and, within
    1e-6, the probabilities of the reference; every class ranked (--top_k=number of classes)."""
    by_name = {row["input"]: row for row in rows}
    for name, expected in zip(names, probabilities):
        row = by_name[name]
        ranked = np.argsort(-expected, kind="stable")
        assert row["class"] == classes[ranked[0]] and not row["error"], (name, row)
        for k, index in enumerate(ranked, start=1):
            suffix = "" if k == 1 else f"_{k}"
            assert row[f"class{suffix}"] == classes[index], (name, k, row)
            assert float(row[f"probability{suffix}"]) == pytest.approx(expected[index], abs=1e-6)


def test_images_give_evaluate_paths_answers_and_a_corrupt_one_is_marked(image_run, tmp_path,
                                                                       capsys):
    run, data, pngs = image_run
    names = copy_test_images(data, pngs, tmp_path / "new")
    (tmp_path / "new" / "broken.png").write_bytes((pngs / names[0]).read_bytes()[:60])
    output = tmp_path / "predictions.csv"
    assert run_cli("predict", f"--model={run}", f"--input={tmp_path / 'new'}",
                   f"--output={output}", "--top_k=10") == 0
    rows = read_output(output)
    # one row per file, in path order, the corrupt one included with its reason
    assert [row["input"] for row in rows] == sorted(str(tmp_path / "new" / n)
                                                    for n in names + ["broken.png"])
    (broken,) = [row for row in rows if row["input"].endswith("broken.png")]
    assert "truncated or corrupt PNG" in broken["error"] and broken["class"] == ""
    out = capsys.readouterr().out
    assert f"predicted {len(names) + 1} rows" in out and "1 bad" in out, out
    classes = [str(i) for i in range(10)]
    for row in rows:
        row["input"] = os.path.relpath(row["input"], tmp_path / "new")
    assert_same_answers([r for r in rows if r is not broken], names, evaluate_path(run, data),
                        classes)


def test_the_summary_counts_the_bad_rows(image_run, tmp_path, capsys):
    run, data, pngs = image_run
    folder = tmp_path / "few"
    folder.mkdir()
    for name in sorted(os.listdir(pngs / "3"))[:3]:
        shutil.copy(pngs / "3" / name, folder / name)
    (folder / "empty.png").write_bytes(b"")
    output = tmp_path / "few.jsonl"
    # 1 of 4 bad: over the default 1%, so the output is kept, and the command fails, saying so
    assert run_cli("predict", f"--model={run}", f"--input={folder}", f"--output={output}") == 1
    err = capsys.readouterr().err
    assert "1 of 4 rows (25.00%) could not be predicted" in err and "empty file" in err
    rows = read_output(output)
    assert [row["error"] for row in rows] == ["", "", "", "empty file"]
    assert run_cli("predict", f"--model={run}", f"--input={folder}", f"--output={output}",
                   "--overwrite", "--max_bad_fraction=0.3") == 0
    out = capsys.readouterr().out
    assert "predicted 4 rows" in out and "1 bad" in out, out


def test_a_converted_split_gives_the_same_answers(image_run, tmp_path):
    run, data, _ = image_run
    output = tmp_path / "records.jsonl"
    assert run_cli("predict", f"--model={run / 'export'}", f"--data={data}", "--split=test",
                   f"--output={output}", "--top_k=10") == 0
    rows = read_output(output)
    assert [row["input"] for row in rows] == [str(i) for i in range(len(rows))]
    assert_same_answers(rows, [str(i) for i in range(len(rows))], evaluate_path(run, data),
                        [str(i) for i in range(10)])


def test_the_int8_tflite_gives_its_own_evaluations_answers(image_run, tmp_path):
    run, data, pngs = image_run
    names = copy_test_images(data, pngs, tmp_path / "new")
    output = tmp_path / "int8.csv"
    assert run_cli("predict", f"--model={run / 'quantized' / 'model_int8.tflite'}",
                   f"--input={tmp_path / 'new'}", f"--output={output}", "--top_k=10",
                   "--batch_size=64") == 0
    rows = read_output(output)
    for row in rows:
        row["input"] = os.path.relpath(row["input"], tmp_path / "new")
    expected = tflite_path(run, data)
    assert_same_answers(rows, names, expected, [str(i) for i in range(10)])
    # not the float model's answers: the interpreter ran
    assert not np.allclose(expected, evaluate_path(run, data), atol=1e-6)


def test_a_short_batch_runs_at_its_size_with_the_full_batchs_answers(image_run):
    """predict's last batch is not padded: the interpreter is resized to it, and each row gets
    what it gets in a full batch."""
    run, data, _ = image_run
    model = tflite_eval.TfliteModel(str(run / "quantized" / "model_int8.tflite"), 1, 8)
    inputs, _ = next(iter(data_lib.load(data, "test", 8, training=False)))
    full, _ = model.run(inputs.numpy())
    model.resize(3)
    short, _ = model.run(inputs.numpy()[:3])
    assert short.shape[0] == 3 and model.interpreter.get_input_details()[0]["shape"][0] == 3
    np.testing.assert_array_equal(short, full[:3])
    model.resize(8)
    again, _ = model.run(inputs.numpy())
    np.testing.assert_array_equal(again, full)


def test_the_python_api_returns_the_cpu_time_of_its_rows(image_run, tmp_path):
    run, data, _ = image_run
    summary = predict.predict(str(run / "quantized" / "model_int8.tflite"),
                              str(tmp_path / "out.csv"), data=data, batch_size=64)
    assert summary.rows == len(split_records(data)) and summary.bad == 0
    assert summary.cpu_seconds > 0


def test_csv_rows_give_evaluate_paths_answers_with_ids_passed_through(csv_run, tmp_path, capsys):
    run, data, people = csv_run
    records = [tf.train.Example.FromString(r).features.feature for r in split_records(data)]
    expected = evaluate_path(run, data)
    # the test records' rows as a user has them: another column order, an id, no label
    with open(tmp_path / "new.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "tenure_months", "city", "monthly_fee", "age"])
        for i, feature in enumerate(records):
            writer.writerow([f"p{i}", repr(feature["tenure_months"].float_list.value[0]),
                             feature["city"].bytes_list.value[0].decode(),
                             repr(feature["monthly_fee"].float_list.value[0]),
                             repr(feature["age"].float_list.value[0])])
        writer.writerow(["short", "12", "lyon"])  # two fields missing
    output = tmp_path / "out.csv"
    assert run_cli("predict", f"--model={run}", f"--input={tmp_path / 'new.csv'}",
                   f"--output={output}", "--top_k=2", "--max_bad_fraction=0.05") == 0
    rows = read_output(output)
    assert len(rows) == len(records) + 1
    assert [row["id"] for row in rows[:-1]] == [f"p{i}" for i in range(len(records))]
    assert rows[-1]["id"] == "short" and rows[-1]["class"] == "" and \
        rows[-1]["error"].startswith("missing column(s) monthly_fee, age")
    assert rows[0]["input"] == f"{tmp_path / 'new.csv'}:2"
    assert_same_answers(rows[:-1], [row["input"] for row in rows[:-1]], expected, ["0", "1"])
    assert f"predicted {len(records) + 1} rows" in capsys.readouterr().out


def test_bad_inputs_are_one_line_each(image_run, csv_run, tmp_path, capsys, text_dir):
    image, _, pngs = image_run
    table, _, people = csv_run
    no_export = tmp_path / "unfinished"
    no_export.mkdir()
    shutil.copy(image / "params.yaml", no_export / "params.yaml")
    (tmp_path / "taken.csv").write_text("mine\n")
    (tmp_path / "folder.csv").mkdir()
    # a language model: its run read from params.yaml (its dataset's tokens label), refused first
    language = tmp_path / "lm"
    (language / "export" / "1").mkdir(parents=True)
    (language / "export" / "1" / "saved_model.pb").write_bytes(b"")
    params = yaml.safe_load((table / "params.yaml").read_text())
    params["data"].update(dir=str(text_dir), pipeline="text")
    params["task"]["type"] = "auto"
    (language / "params.yaml").write_text(yaml.safe_dump(params))
    out = str(tmp_path / "out.csv")
    cases = {
        (f"--model={no_export}", f"--input={pngs}", f"--output={out}"):
            "no export model in",
        (f"--model={table}", f"--input={pngs}", f"--output={out}"):
            "holds images, but the model's dataset (pipeline 'csv') is of CSV files",
        (f"--model={image}", f"--input={people}", f"--output={out}"):
            "holds CSV files, but the model's dataset (pipeline 'image_folder') is of images",
        (f"--model={image}", f"--input={pngs}", f"--output={tmp_path / 'taken.csv'}"):
            "exists; pass --overwrite",
        (f"--model={image}", f"--input={pngs}", f"--output={tmp_path / 'folder.csv'}"):
            "is a directory",
        (f"--model={image}", f"--input={pngs}", f"--output={out}", "--top_k=11"):
            "--top_k=11 must be between 1 and the model's 10 classes",
        (f"--model={language}", "--input=-", f"--output={out}"):
            "is a language model",
    }
    for args, expected in cases.items():
        assert run_cli("predict", *args) != 0, args
        err = capsys.readouterr().err.strip()
        assert expected in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert not os.path.exists(out)
    assert (tmp_path / "taken.csv").read_text() == "mine\n"


def test_a_killed_predict_leaves_no_complete_looking_output(csv_run, tmp_path):
    """Rows arrive through a named pipe that stays open, so predict is mid-way, its first
    batches written, when it is killed."""
    run, _, people = csv_run
    fifo = tmp_path / "rows.csv"
    os.mkfifo(fifo)
    feeder = os.open(fifo, os.O_RDWR)  # never blocks; predict waits for more rows after these
    lines = open(people).read().splitlines()[:21]
    os.write(feeder, ("\n".join(lines) + "\n").encode())
    output = tmp_path / "out.csv"
    process = forked_cli.Popen(["predict", f"--model={run}", f"--input={fifo}",
                                f"--output={output}", "--batch_size=4"], cwd=tmp_path,
                               stdout=forked_cli.DEVNULL, stderr=forked_cli.DEVNULL)
    try:
        deadline = time.monotonic() + BOUND
        while True:  # until the first 16 rows are written under the temporary name
            partial = [p for p in tmp_path.iterdir() if p.name.startswith("out.csv.tmp-")]
            if partial and partial[0].read_text().count("\n") >= 17:
                break
            assert process.poll() is None, "predict ended before it was killed"
            assert time.monotonic() < deadline, "predict wrote no rows"
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(BOUND)
    finally:
        forked_cli.kill_group(process.pid)
        os.close(feeder)
    assert not output.exists()
    assert [p.name.startswith("out.csv.tmp-") for p in tmp_path.iterdir() if p != fifo] == [True]


def test_a_regression_writes_values_in_the_labels_units(tmp_path_factory, tmp_path):
    """people.csv's monthly_fee as a regression target: each row's `value` is the model's
    output as evaluate's path computes it (the head scales back to the label's units)."""
    root = tmp_path_factory.mktemp("predict_regression")
    write_people(root)
    data = str(root / "data")
    write_dataset(load_pipeline("csv", label_column="monthly_fee",
                                columns="monthly_fee:float"), str(root / "people.csv"), data)
    run = root / "run"
    assert run_cli("train", f"--model_dir={run}", "--config=diabetes", "--params_override="
                   f"data.dir={data},data.pipeline=csv,train.epochs=2") == 0
    model = evaluate.load_saved_model(str(run / "export"))
    expected = np.concatenate([model(inputs, training=False).numpy()
                               for inputs, _ in data_lib.load(data, "test", 64, training=False)])
    output = tmp_path / "fees.jsonl"
    assert run_cli("predict", f"--model={run}", f"--data={data}", f"--output={output}") == 0
    rows = read_output(output)
    assert list(rows[0]) == ["input", "value", "error"]
    np.testing.assert_allclose([row["value"] for row in rows], expected.ravel(), rtol=1e-6)
    fees = [r.features.feature["monthly_fee"].float_list.value[0]
            for r in map(tf.train.Example.FromString, split_records(data))]
    # in the label's units (20..120), not standardized: near the fees, far from 0
    assert abs(np.mean([row["value"] for row in rows]) - np.mean(fees)) < 20
    assert run_cli("predict", f"--model={run}", f"--data={data}", f"--output={tmp_path / 'x.csv'}",
                   "--top_k=2") == 2

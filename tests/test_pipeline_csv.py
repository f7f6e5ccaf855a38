"""csv: typed columns (inferred and declared), bad rows, decode output that a Keras model trains on."""
import csv

import numpy as np
import pytest
import tf_keras as keras

from pipelines import Row, load_pipeline
from tests.pipeline_testutil import assert_trains, bad_row_reason, convert, load_all
from tftrain.errors import ConfigError

CITIES = ["paris", "oslo", "lima"]


def make_rows(n, seed=0):
    """age (float), city (categorical), notes (free text), label: 'old' when age > 40 else 'young'."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        age = float(rng.integers(18, 70))
        rows.append({"age": f"{age:g}", "city": CITIES[i % 3], "notes": f"note number {i} {rng.random()}",
                     "label": "old" if age > 40 else "young"})
    return rows


def write_csv(path, rows, header=("age", "city", "notes", "label"), extra_lines=()):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for row in rows:
            writer.writerow([row[h] for h in header])
        for line in extra_lines:
            f.write(line + "\n")
    return path


def test_infers_types_and_reads_back_a_standardized_matrix(tmp_path):
    rows = make_rows(60)
    src = write_csv(tmp_path / "people.csv", rows)
    manifest = convert("csv", src, tmp_path / "out", splits={"train": 1.0})
    info = manifest["info"]
    types = {c["name"]: c["type"] for c in info["columns"]}
    assert types == {"age": "float", "city": "categorical", "notes": "string"}
    assert info["label"] == {"name": "label", "type": "categorical", "class_names": ["old", "young"]}
    assert info["num_classes"] == 2 and info["input_dim"] == 1 + len(CITIES) + 1
    city = next(c for c in info["columns"] if c["name"] == "city")
    assert sorted(city["vocabulary"]) == sorted(CITIES)
    assert manifest["features"]["notes"] == {"dtype": "string", "shape": []}

    x, y = load_all(tmp_path / "out", "train")
    assert x.shape == (60, info["input_dim"]) and x.dtype == np.float32
    ages = np.array([float(r["age"]) for r in rows])
    # Rows come back in shard order: match them through the (unique) standardized age + label.
    age_column = x[:, 0] * next(c["std"] for c in info["columns"] if c["name"] == "age") + ages.mean()
    assert sorted(np.round(age_column, 3)) == sorted(np.round(ages, 3))
    assert abs(x[:, 0].mean()) < 1e-5 and abs(x[:, 0].std() - 1) < 1e-4
    np.testing.assert_array_equal(x[:, 1:].sum(axis=1), np.ones(60))  # one-hot city, no unknowns
    np.testing.assert_array_equal(y, np.where(np.round(age_column) > 40, 0, 1))  # "old" = 0, "young" = 1


def test_declared_columns_regression_label_and_dict_output(tmp_path):
    src = tmp_path / "houses.csv"
    src.write_text("zip,rooms,price,id\n01234,3,250.5,a\n01234,4,300,b\n09999,2,120,c\n")
    options = {"columns": "zip:categorical,rooms:int,price:float,id:ignore", "label_column": "price",
               "output": "dict"}
    manifest = convert("csv", src, tmp_path / "out", splits={"train": 1.0}, num_shards=1, **options)
    assert manifest["info"]["label"]["type"] == "float"
    assert "id" not in manifest["features"] and manifest["features"]["rooms"]["dtype"] == "int64"
    x, y = load_all(tmp_path / "out", "train", pipeline_options=options)
    assert sorted(x) == ["rooms", "zip"]
    zip_vocab = next(c for c in manifest["info"]["columns"] if c["name"] == "zip")["vocabulary"]
    assert zip_vocab == ["01234", "09999"]  # most frequent first; kept as strings, not numbers
    assert y.dtype == np.float32 and sorted(y.tolist()) == [120.0, 250.5, 300.0]
    assert sorted(x["zip"].tolist()) == [0, 0, 1]


def test_bad_rows_are_skipped_with_reasons(tmp_path):
    rows = make_rows(40)
    bad = ["33,oslo", "abc,oslo,text,old", "nan,lima,text,young", "50,paris,text,", "1e999,paris,t,old"]
    src = write_csv(tmp_path / "data.csv", rows, extra_lines=bad)
    manifest = convert("csv", src, tmp_path / "out", splits={"train": 1.0})
    assert manifest["bad_rows"]["count"] == 5
    assert manifest["splits"]["train"]["num_examples"] == 40

    pipeline = load_pipeline("csv")
    info = pipeline.prepare(str(src))
    reasons = [bad_row_reason(pipeline, Row(f"bad{i}", line.split(",")), info) for i, line in enumerate(bad)]
    assert "missing column(s) notes, label" in reasons[0]
    assert "'abc' is not a number" in reasons[1]
    assert "missing value 'nan'" in reasons[2]
    assert "empty label" in reasons[3]
    assert "not a finite number" in reasons[4]
    assert "more than" in bad_row_reason(pipeline, Row("x", ["1", "oslo", "t", "old", "extra"]), info)
    assert "not one of the 2 classes" in bad_row_reason(pipeline, Row("x", ["1", "oslo", "t", "mid"]), info)


def test_allow_nan_imputes_the_mean(tmp_path):
    src = tmp_path / "data.csv"
    src.write_text("a,label\n1,0\n3,1\n,0\nnan,1\n")
    manifest = convert("csv", src, tmp_path / "out", splits={"train": 1.0}, num_shards=1, allow_nan=1)
    assert manifest["bad_rows"]["count"] == 0 and manifest["info"]["num_classes"] == 2
    x, _ = load_all(tmp_path / "out", "train")
    assert sorted(x[:, 0].tolist()) == [-1.0, 0.0, 0.0, 1.0]  # (1-2)/1, NaN -> mean, (3-2)/1


def test_source_splits_from_file_names_and_header_checks(tmp_path):
    write_csv(tmp_path / "src" / "train.csv", make_rows(30, seed=1))
    write_csv(tmp_path / "src" / "test.csv", make_rows(10, seed=2))
    manifest = convert("csv", tmp_path / "src", tmp_path / "out")
    assert {k: v["num_examples"] for k, v in manifest["splits"].items()} == {"train": 30, "test": 10}

    write_csv(tmp_path / "other" / "a.csv", make_rows(3))
    write_csv(tmp_path / "other" / "b.csv", make_rows(3), header=("age", "city", "label", "notes"))
    with pytest.raises(ConfigError, match="share one header"):
        load_pipeline("csv").prepare(str(tmp_path / "other"))
    with pytest.raises(ConfigError, match="label column 'target'"):
        load_pipeline("csv", label_column="target").prepare(str(tmp_path / "src" / "train.csv"))
    with pytest.raises(ConfigError, match="bad column declaration"):
        load_pipeline("csv", columns="age:number")


def test_a_keras_model_trains_on_the_decoded_matrix(tmp_path):
    src = write_csv(tmp_path / "people.csv", make_rows(512))
    manifest = convert("csv", src, tmp_path / "out", splits={"train": 1.0})
    assert_trains(tmp_path / "out", lambda: [
        keras.layers.Input([manifest["info"]["input_dim"]]),
        keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])

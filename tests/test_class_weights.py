"""train.class_weight and per-class measures, on a generated 95/5 imbalanced dataset.

Two overlapping Gaussian classes in 2 features (the minority's mean 2 standard deviations
away): trained with `none`, the small MLP predicts the majority class for nearly everything;
with `balanced`, the same steps and seed find most of the minority. Each run is trained once
(`runs`) and read by the tests that need it: the recall margin, the per-class measures that
`evaluate` reproduces from the export (SavedModel and .tflite), its printed table, and
`tftrain report`'s macro-F1 column. The weights themselves are checked against Keras's own
`fit(class_weight=...)` and scikit-learn's `balanced`; the measures against scikit-learn's.
"""
import json

import numpy as np
import pytest
import tf_keras as keras

from tests.conftest import run_cli
from tftrain import config as config_lib
from tftrain import tasks
from tftrain.data import manifest as manifest_lib
from tftrain.data import reader
from tftrain.errors import ConfigError
from tftrain.tasks import class_measures, class_weights
from tftrain.tasks.classification import ClassificationTask

SEED = 0
SIZES = {"train": 600, "validation": 200, "test": 1000}
MINORITY = 0.05
GAP = 2.0  # minority mean - majority mean, in standard deviations
OVERRIDES = ("data.pipeline=numpy,data.batch_size=30,model.name=mlp,"
             "model.params={hidden_units: [16]},train.steps=100,train.epochs=1,"
             "train.learning_rate=0.01")


def imbalanced(path, seed: int = SEED) -> dict:
    """Writes the dataset's .npz (x_<split>, y_<split>); returns the arrays."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, size in SIZES.items():
        y = np.zeros(size, np.int64)
        y[:round(size * MINORITY)] = 1
        rng.shuffle(y)
        x = rng.normal(size=(size, 2)).astype(np.float32)
        x[:, 0] += GAP * y
        arrays[f"x_{split}"], arrays[f"y_{split}"] = x, y
    np.savez(path, **arrays)
    return arrays


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The dataset, and one run per class_weight (none, balanced) at the same steps and seed."""
    root = tmp_path_factory.mktemp("class_weights")
    arrays = imbalanced(root / "d.npz")
    data = root / "data"
    assert run_cli("convert", "--pipeline=numpy", f"--input={root / 'd.npz'}",
                   f"--output={data}", "--workers=1") == 0
    result = {"root": root, "data": str(data), "arrays": arrays}
    for setting in ("none", "balanced"):
        model_dir = root / setting
        assert run_cli("train", "--config=digits", f"--model_dir={model_dir}",
                       f"--params_override=data.dir={data},{OVERRIDES},"
                       f"train.class_weight={setting}") == 0
        result[setting] = model_dir
        result[f"{setting}_summary"] = json.loads((model_dir / "summary.json").read_text())
    return result


def test_balanced_raises_the_minority_recall_over_none(runs):
    plain = runs["none_summary"]["eval"]["per_class"]["1"]["recall"]
    weighted = runs["balanced_summary"]["eval"]["per_class"]["1"]["recall"]
    # Measured: 0.00 without weights, 0.88 with them (50 minority examples in the test split).
    assert weighted >= plain + 0.5, (plain, weighted)
    assert runs["balanced_summary"]["eval"]["macro_f1"] > runs["none_summary"]["eval"]["macro_f1"]
    params = config_lib.read_yaml(str(runs["balanced"] / "params.yaml"))
    assert params["train"]["class_weight"] == "balanced"


def test_the_test_split_measures_are_evaluates_on_the_export(runs, cli, capsys):
    """train's per-class measures of the test split are what `tftrain evaluate` finds on the
    exported SavedModel and on a .tflite conversion of it; evaluate prints one line per class
    and a macro line, and draws its confusion matrix beside its JSON."""
    from tftrain.optimize import quantize

    summary = runs["balanced_summary"]["eval"]
    support = [int((runs["arrays"]["y_test"] == c).sum()) for c in (0, 1)]
    assert [summary["per_class"][c]["support"] for c in "01"] == support == [950, 50]
    assert np.asarray(summary["confusion_matrix"]).sum(axis=1).tolist() == support
    assert (runs["balanced"] / "confusion.png").read_bytes()[:4] == b"\x89PNG"

    capsys.readouterr()
    assert cli("evaluate", f"--model={runs['balanced'] / 'export'}", f"--data={runs['data']}",
               "--split=test") == 0
    printed = capsys.readouterr().out.splitlines()
    evaluated = json.loads((runs["balanced"] / "eval_test.json").read_text())
    assert evaluated["per_class"] == summary["per_class"]
    assert evaluated["confusion_matrix"] == summary["confusion_matrix"]
    assert evaluated["macro_f1"] == summary["macro_f1"]
    assert class_measures.written_here((runs["balanced"] / "eval_test_confusion.png").read_bytes())
    table = printed[printed.index("class  precision  recall      f1  support"):]
    rows = {line.split()[0]: line.split()[1:] for line in table[1:]}
    assert list(rows) == ["0", "1", "macro"], table
    one = summary["per_class"]["1"]
    assert rows["1"] == [f"{one['precision']:.4f}", f"{one['recall']:.4f}", f"{one['f1']:.4f}",
                         "50"], table
    assert rows["macro"][2:] == [f"{summary['macro_f1']:.4f}", "1000"], table

    tflite = runs["root"] / "balanced.tflite"
    tflite.write_bytes(quantize.convert_saved_model(
        str(next(p for p in (runs["balanced"] / "export").iterdir() if p.name.isdigit()))))
    assert cli("evaluate", f"--model={tflite}", f"--data={runs['data']}", "--split=test",
               f"--output={runs['root'] / 'tflite.json'}") == 0
    lite = json.loads((runs["root"] / "tflite.json").read_text())
    assert lite["confusion_matrix"] == summary["confusion_matrix"]
    assert (runs["root"] / "tflite_confusion.png").exists()


def test_report_shows_macro_f1(runs, cli, capsys):
    capsys.readouterr()
    assert cli("report", str(runs["none"]), str(runs["balanced"]),
               f"--output={runs['root'] / 'report.png'}") == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    column = header.index("test macro_f1")
    assert "test per_class" not in header and "test confusion_matrix" not in header
    cells = {row.split("|")[1].strip(): row.strip("|").split("|")[column].strip()
             for row in lines[2:]}
    for setting in ("none", "balanced"):
        assert cells[setting] == f"{runs[f'{setting}_summary']['eval']['macro_f1']:.4f}"


def test_the_weights_are_kerass_class_weight(runs):
    """A step on the weighted training input moves the weights as Keras's
    `fit(class_weight=...)` does on the same batch, and `balanced` is scikit-learn's."""
    from sklearn.utils.class_weight import compute_class_weight

    manifest = manifest_lib.read(runs["data"])
    config = config_lib.Config()
    config.data.dir, config.data.pipeline = runs["data"], "numpy"
    config.train.class_weight = "balanced"
    weights = class_weights.for_config(config)
    y = runs["arrays"]["y_train"]
    np.testing.assert_allclose(weights, compute_class_weight("balanced", classes=np.unique(y),
                                                             y=y), rtol=1e-12)
    _, task = tasks.resolve(config, manifest)
    assert task.class_weights == weights

    batch = next(iter(reader.load(runs["data"], "train", 60, training=True, seed=SEED,
                                  label_weights=weights)))
    x, labels, sample_weight = (t.numpy() for t in batch)
    np.testing.assert_allclose(sample_weight, np.asarray(weights)[labels], rtol=1e-6)
    assert 0 < labels.sum() < len(labels), labels  # both classes in the batch

    keras.utils.set_random_seed(SEED)
    ours = keras.Sequential([keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
    ours.build((None, 2))
    theirs = keras.models.clone_model(ours)
    theirs.set_weights(ours.get_weights())
    initial = ours.get_weights()
    for model in (ours, theirs):
        model.compile(optimizer=keras.optimizers.SGD(0.5),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ours.fit(x, labels, sample_weight=sample_weight, batch_size=len(x), shuffle=False, verbose=0)
    theirs.fit(x, labels, class_weight=dict(enumerate(weights)), batch_size=len(x),
               shuffle=False, verbose=0)
    for got, want in zip(ours.get_weights(), theirs.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert max(float(np.abs(a - b).max()) for a, b in zip(ours.get_weights(), initial)) > 1e-2


def test_per_class_measures_are_scikit_learns():
    from sklearn.metrics import confusion_matrix, f1_score, precision_recall_fscore_support

    rng = np.random.default_rng(7)
    classes = 5
    labels = rng.integers(0, classes - 1, size=300)  # class 4 never occurs in the labels
    outputs = rng.normal(size=(300, classes))
    outputs[np.arange(300), labels] += 1.0
    outputs[:, 3] -= 10.0  # ... and class 3 is never predicted
    matrix = ClassificationTask({}, num_classes=classes).confusion()
    for start in range(0, 300, 64):  # uneven batches
        matrix.add(outputs[start:start + 64], labels[start:start + 64])
    names = ["a", "b", "c", "d", "e"]
    got = matrix.measures(names)
    predicted = outputs.argmax(axis=1)
    precision, recall, f1, support = precision_recall_fscore_support(
        labels, predicted, labels=range(classes), zero_division=0)
    assert list(got["per_class"]) == got["class_names"] == names
    for i, name in enumerate(names):
        row = got["per_class"][name]
        assert row["precision"] == pytest.approx(precision[i], abs=1e-12)
        assert row["recall"] == pytest.approx(recall[i], abs=1e-12)
        assert row["f1"] == pytest.approx(f1[i], abs=1e-12)
        assert row["support"] == support[i]
    assert got["macro_f1"] == pytest.approx(
        f1_score(labels, predicted, average="macro", zero_division=0), abs=1e-12)
    assert got["confusion_matrix"] == confusion_matrix(labels, predicted,
                                                       labels=range(classes)).tolist()
    assert matrix.measures(["a", "a", "b", "c", "d"])["class_names"] == list("01234")


@pytest.mark.parametrize("setting, match", [
    ("{1: -1}", r"the weight of class 1 is -1, not a positive number"),
    ("{1: abc}", r"the weight of class 1 is 'abc', not a positive number"),
    ("{1: 0}", r"the weight of class 1 is 0, not a positive number"),
    ("balance", r"train.class_weight='balance' is not one of none, balanced .*did you mean "
                r"'balanced'"),
    ("[1, 2]", r"config key 'train.class_weight' must be of type str or dict, got \[1, 2\]"),
    ("{}", r"train.class_weight=\{\} names no class"),
])
def test_bad_weights_are_one_line_before_tensorflow_runs(setting, match):
    with pytest.raises(ConfigError, match=match):
        config_lib.build_config("digits", overrides=f"train.class_weight={setting}")


def test_class_weights_need_a_classifier_and_its_classes(digits_dir, tmp_path, capsys):
    digits = manifest_lib.read(digits_dir)
    config = config_lib.build_config("digits", overrides=f"data.dir={digits_dir},"
                                                         "train.class_weight={'7': 3, 2: 0.5}")
    _, task = tasks.resolve(config, digits)
    assert task.class_weights == (1, 1, 0.5, 1, 1, 1, 1, 3, 1, 1)
    config.train.class_weight = {"cat": 2.0}
    with pytest.raises(ConfigError, match=r"names class 'cat', which dataset \S+ does not have: "
                                          r"its classes are 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 \(or "
                                          r"their ids 0..9\)"):
        tasks.resolve(config, digits)
    config.train.class_weight = {"7": 2.0, 7: 1.0}
    with pytest.raises(ConfigError, match="names class 7 twice"):
        tasks.resolve(config, digits)
    config.train.class_weight = "balanced"
    with pytest.raises(ConfigError, match="balanced needs the training split's label counts.*"
                                          "data.format=tfrecord"):
        class_weights.weights("balanced", {"info": {"num_classes": 3}},
                              config_lib.DataConfig(format="tfrecord"))
    with pytest.raises(ConfigError, match="train.class_weight weights the classes of a "
                                          "classifier, and task.type=regression has none"):
        config_lib.build_config("digits", overrides="task.type=regression,"
                                                    "train.class_weight=balanced")
    tokens = {"info": {"label_stats": {"kind": "tokens"}, "vocab_size": 10}}
    with pytest.raises(ConfigError, match=r"task.type=language_model \(from the dataset's "
                                          r"label\) has none"):
        tasks.from_config(config, tokens)
    # On the command line: one line, exit 2 (a config error), before anything trains.
    code = run_cli("train", f"--model_dir={tmp_path / 'run'}",
                   f"--params_override=data.dir={digits_dir},train.class_weight={{dog: 2}}")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "names class 'dog'" in err[0], err
    assert not (tmp_path / "run" / "summary.json").exists()


def test_mirrored_replicas_train_on_the_weights_too(runs, cli, tmp_path):
    """Under MirroredStrategy (2 replicas), each replica's share of a batch carries its
    examples' weights: the minority is found as on one device. (Pipeline stages and a DTensor
    mesh read the same weighted input: 0.88 minority recall each, measured by hand.)"""
    assert cli("train", "--config=digits", f"--model_dir={tmp_path / 'mirrored'}",
               f"--params_override=data.dir={runs['data']},{OVERRIDES},"
               "train.class_weight=balanced,runtime.strategy=mirrored,runtime.cpu_devices=2") == 0
    summary = json.loads((tmp_path / "mirrored" / "summary.json").read_text())
    assert summary["num_replicas"] == 2
    plain = runs["none_summary"]["eval"]["per_class"]["1"]["recall"]
    assert summary["eval"]["per_class"]["1"]["recall"] >= plain + 0.5, summary["eval"]


def test_a_matrix_sized_by_the_outputs_stops_at_max_classes():
    """A model scored without a known class count (other tools' TFRecords) sizes its matrix
    by its outputs: one over MAX_CLASSES wide counts nothing rather than allocating it."""
    wide = ClassificationTask({}).confusion()
    wide.add(np.zeros((4, class_measures.MAX_CLASSES + 1)), np.zeros(4))
    assert wide.measures() == {}
    sigmoid = ClassificationTask({}).confusion()
    sigmoid.add(np.array([[0.9], [0.2], [0.7]]), np.array([1, 0, 0]))
    assert sigmoid.measures()["confusion_matrix"] == [[1, 1], [0, 1]]

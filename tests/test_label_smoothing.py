"""task.label_smoothing, soft targets and top-5 accuracy: the classification and language-model
losses against numpy's textbook formulas, accuracy on soft targets, top-5 through every output
(Keras logs, summary.json, `tftrain evaluate` of a SavedModel and of a .tflite file), and the
one-line refusals. (A label past data.info's classes: tests/test_imagenet_layout.py.)"""
import json

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tests import documented
from tftrain import config as config_lib
from tftrain import tasks
from tftrain.errors import ConfigError
from tftrain.optimize import quantize, tflite_eval
from tftrain.optimize.evaluate import load_saved_model
from tftrain.optimize.metrics import predictions
from tftrain.data import load
from tftrain.tasks.classification import TOP5, ClassificationTask, cross_entropy
from tftrain.tasks.language_model import LanguageModelTask, next_token_metrics


def log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def textbook_loss(logits, targets, eps):
    """Mean cross-entropy against the smoothed targets y * (1 - eps) + eps / K."""
    targets = np.asarray(targets, np.float64)
    smoothed = targets * (1 - eps) + eps / targets.shape[-1]
    return float(-(smoothed * log_softmax(logits)).sum(axis=-1).mean())


def numpy_top5(outputs, labels):
    top = np.argsort(-np.asarray(outputs), axis=1, kind="stable")[:, :5]
    return float((top == np.asarray(labels).reshape(-1, 1)).any(axis=1).mean())


RNG = np.random.default_rng(7)
LOGITS = RNG.normal(0, 2, size=(64, 12)).astype(np.float32)
IDS = RNG.integers(0, 12, size=64)
ONE_HOT = np.eye(12, dtype=np.float32)[IDS]
SOFT = RNG.dirichlet(np.full(12, 0.3), size=64).astype(np.float32)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.4])
def test_the_loss_is_the_textbook_smoothed_cross_entropy(eps):
    loss = ClassificationTask({}, num_classes=12, label_smoothing=eps).loss()
    expected = textbook_loss(LOGITS, ONE_HOT, eps)
    # ids as a split yields them ([B] or [B, 1]) and their one-hot soft target: the same loss
    for targets in (IDS, IDS.reshape(-1, 1), ONE_HOT):
        assert float(loss(targets, LOGITS)) == pytest.approx(expected, rel=1e-5), targets.shape
    # a mixed (soft) target
    assert float(loss(SOFT, LOGITS)) == pytest.approx(textbook_loss(LOGITS, SOFT, eps), rel=1e-5)
    # the task's numpy loss (`tftrain evaluate`) is the same one
    assert cross_entropy(LOGITS, IDS, eps) == pytest.approx(expected, rel=1e-6)
    # sample weights (class weights, mixed weights) weigh each example's loss
    weights = RNG.random(64).astype(np.float32)
    per_example = -(((ONE_HOT * (1 - eps) + eps / 12) * log_softmax(LOGITS)).sum(axis=-1))
    assert float(loss(IDS, LOGITS, sample_weight=weights)) == pytest.approx(
        float((per_example * weights).sum() / 64), rel=1e-5)


def test_ids_become_one_hot_only_where_smoothing_needs_it():
    def ops(eps, targets):
        loss = ClassificationTask({}, num_classes=12, label_smoothing=eps).loss()
        traced = tf.function(lambda y, p: loss(y, p)).get_concrete_function(
            tf.TensorSpec([None, *targets.shape[1:]], tf.as_dtype(targets.dtype)),
            tf.TensorSpec([None, 12], tf.float32))
        return {op.type for op in traced.graph.get_operations()}

    plain = ops(0.0, IDS)
    assert "SparseSoftmaxCrossEntropyWithLogits" in plain and "OneHot" not in plain
    smoothed = ops(0.1, IDS.reshape(-1, 1))
    assert "OneHot" in smoothed and "SoftmaxCrossEntropyWithLogits" in smoothed
    assert "OneHot" not in ops(0.1, SOFT)


def test_a_softmax_model_and_float16_logits_keep_their_loss():
    model = keras.Sequential([keras.Input([3]), keras.layers.Dense(12, activation="softmax")])
    loss = ClassificationTask({}, num_classes=12, label_smoothing=0.1).loss(model)
    probabilities = tf.nn.softmax(LOGITS).numpy()
    assert float(loss(IDS, probabilities)) == pytest.approx(
        textbook_loss(LOGITS, ONE_HOT, 0.1), rel=1e-4)
    # a mixed-precision model's float16 logits: reduced in float32
    loss = ClassificationTask({}, num_classes=12, label_smoothing=0.1).loss()
    half = loss(IDS, tf.constant(LOGITS, tf.float16))
    assert half.dtype == tf.float32
    assert float(half) == pytest.approx(textbook_loss(LOGITS.astype(np.float16), ONE_HOT, 0.1),
                                        rel=1e-4)


def test_accuracy_and_top5_take_ids_and_soft_targets():
    task = ClassificationTask({}, num_classes=12)
    expected = {"accuracy": float((LOGITS.argmax(1) == IDS).mean()),
                TOP5: numpy_top5(LOGITS, IDS)}
    assert 0 < expected["accuracy"] < expected[TOP5] < 1  # the data tells them apart
    # a mixed target whose larger part is the label: its argmax is the label
    mixed = 0.7 * ONE_HOT + 0.3 * np.roll(ONE_HOT, 1, axis=1)
    for targets in (IDS, IDS.reshape(-1, 1), ONE_HOT, mixed):
        metrics = task.metrics()
        assert [m.name for m in metrics] == ["accuracy", TOP5]
        for start in range(0, 64, 24):  # streaming over uneven batches
            for metric in metrics:
                metric.update_state(targets[start:start + 24], LOGITS[start:start + 24])
        got = {m.name: float(m.result()) for m in metrics}
        assert got == pytest.approx(expected, abs=1e-6), targets.shape
    evaluated = task.evaluate(LOGITS, IDS)
    assert (evaluated["accuracy"], evaluated[TOP5]) == pytest.approx(
        (expected["accuracy"], expected[TOP5]), abs=1e-12)
    # under 10 classes there is no top-5 accuracy anywhere
    few = ClassificationTask({}, num_classes=9)
    assert [m.name for m in few.metrics()] == ["accuracy"]
    assert set(few.evaluate(LOGITS[:, :9], IDS % 9)) == {"loss", "accuracy"}


def test_top5_counts_ties_for_the_label_as_tensorflow_does():
    scores = np.array([[1, 1, 1, 1, 1, 1, 0, 0, 0, 0],  # six tied above the rest
                       [5, 4, 3, 2, 1, 0, 0, 0, 0, 0]], np.float32)
    labels = np.array([5, 5])
    metric = ClassificationTask({}, num_classes=10).metrics()[1]
    metric.update_state(labels, scores)
    assert float(metric.result()) == 0.5  # tied with the 5 best: in; sixth best: out
    assert ClassificationTask({}, num_classes=10).evaluate(scores, labels)[TOP5] == 0.5


def test_training_on_soft_targets_validates_on_ids():
    """Keras traces the train and the test step apart: the train step's soft targets do not
    fix the form the validation's ids are read in."""
    keras.utils.set_random_seed(1)
    task = ClassificationTask({}, num_classes=12, label_smoothing=0.1)
    features = RNG.normal(size=(64, 5)).astype(np.float32)
    model = keras.Sequential([keras.Input([5]), keras.layers.Dense(12)])
    model.compile("sgd", task.loss(), task.metrics())
    history = model.fit(features, SOFT, batch_size=16, epochs=1, verbose=0,
                        validation_data=(features, IDS.reshape(-1, 1)))
    outputs = model.predict(features, verbose=0)
    assert history.history["val_accuracy"][-1] == pytest.approx(
        float((outputs.argmax(1) == IDS).mean()))
    assert history.history[f"val_{TOP5}"][-1] == pytest.approx(numpy_top5(outputs, IDS))
    assert history.history["val_loss"][-1] == pytest.approx(
        textbook_loss(outputs, np.eye(12)[IDS], 0.1), rel=1e-4)


def test_the_language_model_smooths_over_the_vocabulary():
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 3, size=(3, 7, 20)).astype(np.float32)  # [batch, positions, vocab]
    ids = rng.integers(0, 20, size=(3, 7)).astype(np.int32)
    one_hot = np.eye(20)[ids].reshape(-1, 20)
    task = LanguageModelTask({"vocab_size": 20}, label_smoothing=0.2)
    expected = textbook_loss(logits.reshape(-1, 20), one_hot, 0.2)
    assert float(task.loss()(ids, logits)) == pytest.approx(expected, rel=1e-5)
    got = task.evaluate(logits, ids)
    assert got["loss"] == pytest.approx(expected, rel=1e-9)
    # perplexity is the model's, never smoothed
    plain = next_token_metrics(logits, ids)
    assert got["perplexity"] == plain["perplexity"]
    assert plain["loss"] == pytest.approx(textbook_loss(logits.reshape(-1, 20), one_hot, 0.0))
    assert abs(plain["loss"] - got["loss"]) > 0.01


def test_bad_settings_are_one_line(cli, capsys, digits_dir, tmp_path):
    for value in (1.0, -0.1, float("nan")):
        config = config_lib.Config()
        config.task.label_smoothing = value
        with pytest.raises(ConfigError, match=r"^task.label_smoothing=\S+ must be in \[0, 1\)"):
            config_lib.validate(config)
    config = config_lib.Config()
    config.task.type, config.task.label_smoothing = "regression", 0.1
    with pytest.raises(ConfigError) as raised:
        config_lib.validate(config)
    assert str(raised.value) == (
        "task.label_smoothing=0.1 smooths class targets, and task.type=regression has none: "
        "remove task.label_smoothing (or set it to 0)")
    # task.type=auto found a float label: refused when the task is resolved
    config = config_lib.Config()
    config.task.label_smoothing = 0.1
    manifest = {"pipeline": "csv", "info": {"label_stats": {"kind": "float"}}}
    with pytest.raises(ConfigError, match=r"task.type=regression \(from the dataset's label\) "
                                          "has none"):
        tasks.resolve(config, manifest)
    # through the CLI: one line, before anything is trained
    assert cli("train", f"--model_dir={tmp_path / 'run'}",
               f"--params_override=data.dir={digits_dir},task.label_smoothing=1") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tftrain train: error: task.label_smoothing=1.0 must be in [0, 1) (0: off; "
                   "0.1 is the usual value for ImageNet classifiers)"], err
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.fixture(scope="module")
def smoothed_run(tmp_path_factory, digits_dir):
    """docs/training.md's smoothed `tftrain train`, for 2 epochs of 6 steps on the session's
    digits (read-only)."""
    from tests.conftest import run_cli

    run = tmp_path_factory.mktemp("smoothed") / "run"
    documented_args = documented.args("tftrain train --config=digits --model_dir=runs/smoothed "
                                      "--params_override=task.label_smoothing=0.1")
    assert run_cli(*documented.replaced(documented_args, model_dir=run, params_override=(
        f"task.label_smoothing=0.1,data.dir={digits_dir},train.epochs=2,"
        "train.steps_per_epoch=6"))) == 0
    return run


def test_a_smoothed_run_reports_the_smoothed_loss_and_top5(smoothed_run, digits_dir):
    summary = json.loads((smoothed_run / "summary.json").read_text())
    assert summary["task"] == {"type": "classification", "loss": "crossentropy",
                               "label_smoothing": 0.1}
    model = load_saved_model(str(smoothed_run / "export"))
    outputs, labels = predictions(model, load(digits_dir, "test", 64, training=False))
    assert summary["eval"]["loss"] == pytest.approx(cross_entropy(outputs, labels, 0.1),
                                                    rel=1e-5)
    # not the plain cross-entropy (100x the tolerance above away from it)
    assert abs(cross_entropy(outputs, labels) - summary["eval"]["loss"]) > 1e-3
    assert summary["eval"][TOP5] == pytest.approx(numpy_top5(outputs, labels), abs=1e-6)
    assert summary["eval"]["accuracy"] < summary["eval"][TOP5]
    assert TOP5 in summary["validation"]
    for epoch in json.loads((smoothed_run / "curves.json").read_text())["epochs"]:
        assert {TOP5, f"val_{TOP5}"} <= set(epoch), epoch


def test_evaluate_reports_top5_of_a_saved_model_and_a_tflite_file(smoothed_run, digits_dir,
                                                                   tmp_path, cli, capsys):
    model = load_saved_model(str(smoothed_run / "export"))
    outputs, labels = predictions(model, load(digits_dir, "test", 64, training=False))
    assert cli("evaluate", f"--model={smoothed_run / 'export'}",
               f"--output={tmp_path / 'saved.json'}") == 0
    saved = json.loads((tmp_path / "saved.json").read_text())
    assert saved[TOP5] == pytest.approx(numpy_top5(outputs, labels), abs=1e-12)
    assert saved["loss"] == pytest.approx(cross_entropy(outputs, labels, 0.1), rel=1e-6)
    assert f"{TOP5}=" in capsys.readouterr().out
    tflite = tmp_path / "model.tflite"
    tflite.write_bytes(quantize.convert(model, "float"))
    assert cli("evaluate", f"--model={tflite}", f"--data={digits_dir}", "--split=test",
               f"--output={tmp_path / 'tflite.json'}") == 0
    got = json.loads((tmp_path / "tflite.json").read_text())
    interpreted, tflite_labels, _ = tflite_eval.predict_tflite(
        tflite.read_bytes(), load(digits_dir, "test", 64, training=False))
    assert got[TOP5] == pytest.approx(numpy_top5(interpreted, tflite_labels), abs=1e-12)


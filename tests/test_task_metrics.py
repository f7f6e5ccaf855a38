"""The tasks' metrics, checked against numbers worked out by hand or by scikit-learn: the numpy
`evaluate` of each task (what prune, quantize and `tftrain evaluate` score a model with), the
streaming Keras metrics fit reports (R², perplexity, bits per byte), the measure's `change` the
gates bound, and the monitored metric's direction. No model is trained; `make mutation` runs
them."""
import math

import numpy as np
import pytest
import tf_keras as keras
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

from tftrain.errors import ConfigError
from tftrain.tasks import language_model
from tftrain.tasks.base import as_rows
from tftrain.tasks.classification import (ClassificationTask, count_correct, cross_entropy,
                                          predicted_classes)
from tftrain.tasks.language_model import LanguageModelTask, next_token_metrics
from tftrain.tasks.r2_metric import R2
from tftrain.tasks.regression import RegressionTask, huber, regression_metrics

LN = math.log


def log_softmax(row, i):
    return row[i] - LN(sum(math.exp(v) for v in row))


# ---- the Task base: losses, monitors, the measure's change --------------------------------------

def test_the_loss_auto_is_the_tasks_first():
    info = {"x": 1}
    task = RegressionTask(info)
    assert (task.loss_name, task.info) == ("mse", info)
    assert RegressionTask(info, "auto").loss_name == "mse"
    assert RegressionTask(info, "huber").loss_name == "huber"
    assert task.resolved() == {"type": "regression", "loss": "mse", "label_smoothing": 0.0}
    assert ClassificationTask({}, label_smoothing=0.1).resolved() == {
        "type": "classification", "loss": "crossentropy", "label_smoothing": 0.1}
    with pytest.raises(ConfigError) as raised:
        RegressionTask(info, "hinge")
    assert str(raised.value) == ("task.loss='hinge' is not a loss of task.type=regression: "
                                 "choose auto or one of mse, mae, huber")


def test_a_task_without_its_own_constructor_takes_the_first_loss():
    from tftrain.tasks.base import Task

    class Echo(Task):  # a user's task module may define no __init__
        name, losses = "echo", ("l1", "l2")
        outputs = loss = metrics = evaluate = None

    assert Echo({}).loss_name == "l1" and Echo({}, "l2").loss_name == "l2"


def test_the_monitored_metric_and_its_direction():
    assert RegressionTask.monitor("auto") == "val_rmse"
    assert RegressionTask.monitor("val_r2") == "val_r2"
    assert RegressionTask.monitor("mae") == "mae"
    assert [RegressionTask.mode(m) for m in ("auto", "val_r2", "r2", "val_loss")] == [
        "min", "max", "max", "min"]
    assert (ClassificationTask.mode("auto"), ClassificationTask.mode("loss")) == ("max", "min")
    assert LanguageModelTask.mode("val_bits_per_byte") == "min"
    RegressionTask.check_monitor("auto")
    with pytest.raises(ConfigError) as raised:
        ClassificationTask.check_monitor("val_rmse")
    assert str(raised.value) == (
        "train.monitor=val_rmse is not a metric of the classification task: choose auto "
        "(= val_accuracy) or one of val_loss, val_accuracy, loss, accuracy")
    with pytest.raises(ConfigError):
        RegressionTask.check_monitor("rmse_val")


def test_how_much_worse_a_measure_got():
    classifier, regressor = ClassificationTask({}), RegressionTask({})
    assert classifier.change(0.9, 0.85) == pytest.approx(0.05)  # accuracy: points lost
    assert classifier.change(0.85, 0.9) == pytest.approx(-0.05)
    assert regressor.change(2.0, 2.5) == 0.25  # rmse: relative increase
    assert regressor.change(2.0, 1.0) == -0.5
    assert regressor.change(0.0, 0.3) == 0.3  # from 0: the increase itself
    lm = LanguageModelTask({"vocab_size": 4})
    assert lm.change(10.0, 11.0) == pytest.approx(0.1)  # perplexity: relative


def test_evaluate_keys_are_the_reported_metrics_present():
    task = RegressionTask({})
    assert task.evaluate_keys({"r2": 1, "latency_ms": 2, "loss": 3, "rmse": 4}) == [
        "loss", "rmse", "r2"]


def test_as_rows():
    rows = as_rows([1, 2, 3], "x")
    assert rows.dtype == np.float64 and rows.shape == (3, 1)
    assert as_rows(np.zeros((2, 3, 4)), "x").shape == (2, 12)
    with pytest.raises(ValueError) as raised:
        as_rows([], "labels")
    assert str(raised.value) == "no labels to evaluate: the evaluation dataset is empty"


# ---- classification -----------------------------------------------------------------------------

def test_predicted_classes():
    assert predicted_classes([0.2, 0.7, 0.5, 0.51]).tolist() == [0, 1, 0, 1]  # one sigmoid
    assert predicted_classes([[0.2], [0.7], [0.5]]).tolist() == [0, 1, 0]
    assert predicted_classes([[0.1, 0.9], [2.0, -1.0]]).tolist() == [1, 0]  # two logits
    assert predicted_classes([[0.1, 0.3, 0.2]]).tolist() == [1]  # a batch of one
    assert predicted_classes(np.array([[[0, 5], [1, 0]], [[9, 0], [0, 1]]])).tolist() == [1, 0]
    assert predicted_classes(np.array([[[0, 5, 1]], [[9, 0, 1]]])).tolist() == [1, 0]
    assert predicted_classes([0.7, 0.2]).dtype == np.int64


def test_count_correct():
    assert count_correct([[0.1, 0.9], [2.0, -1.0], [0, 3]], [1, 1, 1]) == 2
    assert count_correct([[0.1, 0.9], [2.0, -1.0]], np.array([[1.0], [0.0]])) == 2
    assert count_correct([0.9, 0.1, 0.6], [1, 1, 0]) == 1


def test_cross_entropy_by_hand():
    logits, labels = [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], [2, 0]
    expected = -(log_softmax([1, 2, 3], 2) + log_softmax([0, 0, 0], 0)) / 2
    assert cross_entropy(logits, labels) == pytest.approx(expected, rel=1e-12)
    assert cross_entropy([[1000.0, 0.0]], [1]) == pytest.approx(1000.0)  # no overflow
    # each row shifted by its own maximum: a row far below another does not underflow
    assert cross_entropy([[1000.0, 0.0], [0.0, 1.0]], [0, 1]) == pytest.approx(
        -log_softmax([0.0, 1.0], 1) / 2)
    with pytest.raises(ValueError) as raised:
        cross_entropy(np.zeros((0, 3)), [])
    assert str(raised.value) == "no outputs to evaluate: the evaluation dataset is empty"
    assert cross_entropy([[1000.0, 0.0]], [0]) == pytest.approx(0.0, abs=1e-12)
    # more examples than classes, labels as floats in a column
    logits = np.random.default_rng(4).normal(size=(4, 3))
    expected = -np.mean([log_softmax(row, i) for row, i in zip(logits, [0, 1, 2, 1])])
    assert cross_entropy(logits, [[0.0], [1.0], [2.0], [1.0]]) == pytest.approx(expected)


def test_classification_evaluate():
    task = ClassificationTask({}, num_classes=3)
    logits = [[1.0, 2.0, 3.0], [3.0, 0.0, 0.0], [0.0, 4.0, 0.0], [0.0, 0.0, 1.0]]
    result = task.evaluate(logits, [2, 0, 0, 1])
    assert result == {"loss": pytest.approx(cross_entropy(logits, [2, 0, 0, 1])),
                      "accuracy": 0.5}
    assert task.evaluate([[0.1, 0.9], [0.8, 0.2]], [1, 1]) == {
        "loss": pytest.approx(cross_entropy([[0.1, 0.9], [0.8, 0.2]], [1, 1])), "accuracy": 0.5}
    assert task.evaluate([[0.9], [0.2], [0.6], [0.1]], [[1], [1], [1], [0]]) == {"accuracy": 0.75}


def _smoothed_by_hand(row, label, eps):
    """(1 - eps) * -log p[label] + eps * mean over classes of -log p: the smoothed target's loss."""
    nats = [-log_softmax(row, k) for k in range(len(row))]
    return (1 - eps) * nats[label] + eps * sum(nats) / len(row)


def test_smoothed_cross_entropy_and_top5_in_evaluate():
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(6, 12))
    labels = [0, 3, 11, 5, 7, 2]
    expected = np.mean([_smoothed_by_hand(row, k, 0.1) for row, k in zip(logits, labels)])
    assert cross_entropy(logits, labels, 0.1) == pytest.approx(expected, rel=1e-12)
    assert cross_entropy(logits, labels, 0.1) != pytest.approx(cross_entropy(logits, labels))
    # top-5: the label among the 5 highest scores (fewer than 5 scores above it)
    ranks = [(row > row[k]).sum() for row, k in zip(logits, labels)]
    in_top5 = sum(rank < 5 for rank in ranks) / 6
    assert 0 < in_top5 < 1  # the data tells a top-5 from a top-4 or top-6 count
    assert any(rank == 4 for rank in ranks) and any(rank == 5 for rank in ranks)
    smoothed = ClassificationTask({}, num_classes=12, label_smoothing=0.1)
    result = smoothed.evaluate(logits, labels)
    assert result == {"loss": pytest.approx(expected, rel=1e-12),
                      "accuracy": count_correct(logits, labels) / 6,
                      "top5_accuracy": pytest.approx(in_top5)}
    assert ClassificationTask({}, num_classes=12).evaluate(logits, labels)["loss"] == \
        pytest.approx(cross_entropy(logits, labels), rel=1e-12)
    # ten classes have a top-5; nine do not
    ten = ClassificationTask({}, num_classes=10).evaluate(logits[:, :10], [0, 3, 9, 5, 7, 2])
    assert "top5_accuracy" in ten
    assert "top5_accuracy" not in ClassificationTask({}, num_classes=9).evaluate(
        logits[:, :9], [0, 3, 8, 5, 7, 2])
    # a tie with the fifth score counts for the label (as tf.math.in_top_k)
    tied = np.array([[5.0, 4.0, 3.0, 2.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
    assert ClassificationTask({}, num_classes=10).evaluate(tied, [5])["top5_accuracy"] == 1.0
    assert ClassificationTask({}, num_classes=10).evaluate(tied, [6])["top5_accuracy"] == 0.0


def test_smoothed_next_token_loss_by_hand():
    logits = np.array([[[1.0, 2.0, 0.0], [0.0, 0.0, 3.0]]], np.float64)
    labels = np.array([[1, 2]])
    rows = logits.reshape(2, 3).tolist()
    expected = np.mean([_smoothed_by_hand(row, k, 0.2) for row, k in zip(rows, [1, 2])])
    plain = next_token_metrics(logits, labels)
    got = next_token_metrics(logits, labels, label_smoothing=0.2)
    assert got["loss"] == pytest.approx(expected, rel=1e-12)
    assert got["perplexity"] == pytest.approx(plain["perplexity"], rel=1e-12)  # never smoothed
    task = LanguageModelTask({}, vocab_size=3, label_smoothing=0.2)
    assert task.evaluate(logits, labels)["loss"] == pytest.approx(expected, rel=1e-12)


# ---- regression ---------------------------------------------------------------------------------

def test_regression_metrics_against_scikit_learn():
    truth = np.array([[1.0, 10.0], [2.0, 30.0], [4.0, 20.0], [7.0, 25.0], [3.0, 0.0]])
    predicted = np.array([[1.5, 12.0], [1.0, 27.0], [4.0, 26.0], [6.0, 20.0], [3.5, 1.0]])
    got = regression_metrics(predicted, truth)
    assert got == {"mse": pytest.approx(mean_squared_error(truth, predicted), rel=1e-12),
                   "rmse": pytest.approx(mean_squared_error(truth, predicted) ** 0.5,
                                         rel=1e-12),
                   "mae": pytest.approx(mean_absolute_error(truth, predicted), rel=1e-12),
                   "r2": pytest.approx(r2_score(truth, predicted), rel=1e-12)}
    assert all(type(v) is float for v in got.values())
    # one output per example, labels as a flat vector
    got = regression_metrics(predicted[:, :1], truth[:, 0])
    assert got["r2"] == pytest.approx(r2_score(truth[:, 0], predicted[:, 0]), rel=1e-12)
    assert got["mae"] == pytest.approx(0.6)


def test_regression_metrics_of_labels_with_a_small_spread():
    truth, predicted = np.array([0.1, 0.2, 0.3]), np.array([0.12, 0.2, 0.27])
    assert regression_metrics(predicted, truth)["r2"] == pytest.approx(
        r2_score(truth, predicted), rel=1e-12)  # SST 0.02 < 1


def test_regression_metrics_refuse_what_does_not_match():
    with pytest.raises(ValueError) as raised:
        regression_metrics([], [1.0])
    assert str(raised.value) == "no outputs to evaluate: the evaluation dataset is empty"
    with pytest.raises(ValueError) as raised:
        regression_metrics([[1.0]], [])
    assert str(raised.value) == "no labels to evaluate: the evaluation dataset is empty"
    with pytest.raises(ValueError):  # one label for three outputs
        regression_metrics([[1.0], [2.0], [3.0]], [2.0])


def test_a_constant_label_has_no_r2():
    got = regression_metrics([[1.0], [2.0], [3.0]], [2.0, 2.0, 2.0])
    assert math.isnan(got["r2"]) and got["mse"] == pytest.approx(2 / 3)
    got = regression_metrics([[1.0, 1.0], [2.0, 2.0]], [[2.0, 1.0], [2.0, 3.0]])
    assert math.isnan(got["r2"])  # any output without spread: no mean R²
    assert regression_metrics([[2.0], [2.0]], [2.0, 2.0])["mse"] == 0.0


def test_huber_by_hand():
    errors = np.array([0.5, -2.0, 3.0, -0.1])
    assert huber(errors, 1.0) == pytest.approx((0.125 + 1.5 + 2.5 + 0.005) / 4)
    assert huber(errors, 2.5) == pytest.approx((0.125 + 2.0 + (7.5 - 3.125) + 0.005) / 4)


def test_regression_evaluate_uses_the_tasks_loss():
    outputs, labels = [[1.0], [2.0], [6.0]], [1.5, 2.0, 3.0]
    metrics = regression_metrics(outputs, labels)
    assert RegressionTask({}, "mse").evaluate(outputs, labels) == {
        "loss": metrics["mse"], **metrics}
    assert RegressionTask({}, "mae").evaluate(outputs, labels)["loss"] == metrics["mae"]
    errors = np.array([-0.5, 0.0, 3.0])
    assert RegressionTask({}, "huber").evaluate(outputs, labels)["loss"] == pytest.approx(
        huber(errors, 1.0))
    assert RegressionTask({}, "huber", mean=[0.0], std=[2.0]).evaluate(outputs, labels)["loss"] == \
        pytest.approx((0.125 + 0 + (6 - 2)) / 3)  # delta: the label's std


def test_regression_outputs_and_statistics():
    task = RegressionTask({})
    assert (task.size, task.mean, task.std) == (1, (), ())
    task = RegressionTask({}, shape=(2, 3), mean=np.arange(6), std=np.ones(6))
    assert task.size == 6 and task.mean == (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)
    assert task.std == (1.0,) * 6 and type(task.mean[0]) is float
    task = RegressionTask({}, shape=(3,), mean=5.0, std=2.0)
    assert (task.size, task.mean, task.std) == (3, (5.0,), (2.0,))
    # statistics that do not fit the outputs are not used
    assert RegressionTask({}, shape=(3,), mean=[1, 2], std=[1, 2]).mean == ()
    assert RegressionTask({}, shape=(3,), mean=[1, 2, 3], std=[1]).std == ()
    assert RegressionTask({}, shape=(3,), mean=[1, 2, 3], std=None).mean == ()
    assert RegressionTask({}, shape=(3,), mean=None, std=[1, 2, 3]).std == ()
    assert RegressionTask({}, shape=(0,)).size == 1


# ---- language model -----------------------------------------------------------------------------

def test_next_token_metrics_by_hand():
    logits = np.array([[[1.0, 2.0, 0.0], [0.0, 0.0, 3.0]],
                       [[2.0, 1.0, 1.0], [0.6, 0.5, 0.0]]], np.float32)
    labels = np.array([[1, 2], [1, 0]])
    rows = logits.reshape(4, 3).astype(np.float64).tolist()
    nats = [-log_softmax(row, i) for row, i in zip(rows, labels.reshape(-1))]
    got = next_token_metrics(logits, labels)
    assert got == {"loss": pytest.approx(sum(nats) / 4, rel=1e-12),
                   "perplexity": pytest.approx(math.exp(sum(nats) / 4), rel=1e-12),
                   "accuracy": 0.75}  # all but the third position
    assert list(got) == ["loss", "perplexity", "accuracy"]
    sizes = [1.0, 3.0, 2.0]  # bytes of ids 0, 1, 2: the labels stand for 3 + 2 + 3 + 1 bytes
    got = next_token_metrics(logits, labels, sizes)
    assert got["bits_per_byte"] == pytest.approx(sum(nats) / LN(2) / 9, rel=1e-12)
    assert list(got) == ["loss", "perplexity", "bits_per_byte", "accuracy"]
    assert math.isnan(next_token_metrics(logits, labels, [0.0, 0.0, 0.0])["bits_per_byte"])


def test_next_token_metrics_stay_finite_at_any_scale():
    # each position shifted by its own maximum: no overflow, and a row far below another
    # (by more than exp can tell from 0) does not underflow
    got = next_token_metrics(np.array([[1000.0, 0.0], [0.0, 1.0]]), np.array([0, 1]))
    assert got["loss"] == pytest.approx(-log_softmax([0.0, 1.0], 1) / 2)
    half = next_token_metrics(np.array([[0.0, 1.0]]), np.array([1]), [0.0, 0.5])
    assert half["bits_per_byte"] == pytest.approx(-log_softmax([0.0, 1.0], 1) / LN(2) / 0.5)


def test_next_token_metrics_over_many_chunks():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(70_001, 2))
    labels = rng.integers(0, 2, size=70_001)
    got = next_token_metrics(logits, labels, [1.0, 2.0])
    assert got["loss"] == pytest.approx(cross_entropy(logits, labels), rel=1e-9)
    assert got["accuracy"] == count_correct(logits, labels) / 70_001
    smoothed = next_token_metrics(logits, labels, label_smoothing=0.3)  # over every chunk
    assert smoothed["loss"] == pytest.approx(cross_entropy(logits, labels, 0.3), rel=1e-9)
    bits = got["loss"] * 70_001 / LN(2) / (70_001 + labels.sum())
    assert got["bits_per_byte"] == pytest.approx(bits, rel=1e-9)


def test_next_token_metrics_of_nothing():
    with pytest.raises(ValueError) as raised:
        next_token_metrics(np.zeros((0, 3)), np.zeros((0,)))
    assert str(raised.value) == "no outputs to evaluate: the evaluation dataset is empty"


def test_the_language_model_evaluates_with_its_token_bytes():
    logits, labels = np.array([[3.0, 0.0], [0.0, 1.0]]), np.array([0, 0])
    task = LanguageModelTask({"vocab_size": 2, "token_bytes": [2.0, 1.0]})
    assert task.evaluate(logits, labels) == next_token_metrics(logits, labels, [2.0, 1.0])
    assert "bits_per_byte" not in LanguageModelTask({"vocab_size": 2}).evaluate(logits, labels)


# ---- the streaming Keras metrics ----------------------------------------------------------------

def test_r2_streams_scikit_learns_r2():
    truth = np.array([[1.0, 10.0], [2.0, 30.0], [4.0, 20.0], [7.0, 25.0], [3.0, 0.0]])
    predicted = np.array([[1.5, 12.0], [1.0, 27.0], [4.0, 26.0], [6.0, 20.0], [3.5, 1.0]])
    metric = R2(2)
    metric.update_state(truth[:2], predicted[:2])  # two batches: one R² over all five
    metric.update_state(truth[2:], predicted[2:])
    assert float(metric.result()) == pytest.approx(r2_score(truth, predicted), rel=1e-5)
    metric.reset_state()
    assert [v.numpy().tolist() for v in metric.variables] == [[0.0, 0.0]] * 4
    metric.update_state(truth, predicted)
    assert float(metric.result()) == pytest.approx(r2_score(truth, predicted), rel=1e-5)


def test_r2_of_one_output_with_weights():
    truth = np.array([1.0, 2.0, 4.0, 7.0])
    predicted = np.array([[1.5], [1.0], [4.0], [6.0]])
    weights = np.array([0.5, 0.25, 0.5, 0.25])  # they add up to 1.5: between 1 and 2
    metric = R2()
    metric.update_state(truth, predicted, sample_weight=weights)
    assert float(metric.result()) == pytest.approx(
        r2_score(truth, predicted[:, 0], sample_weight=weights), rel=1e-5)
    metric = R2()
    metric.update_state(truth, predicted)
    assert float(metric.result()) == pytest.approx(r2_score(truth, predicted[:, 0]), rel=1e-5)


def test_r2_is_saved_with_its_size_and_variables():
    metric = R2(3, name="r2_val")
    assert metric.name == "r2_val" and R2().name == "r2" and metric.size == 3
    assert [v.name for v in metric.variables] == [
        "count:0", "sum:0", "sum_of_squares:0", "squared_errors:0"]
    assert all(v.shape == (3,) for v in metric.variables)
    config = metric.get_config()
    assert config["size"] == 3 and config["name"] == "r2_val"
    assert R2.from_config(config).size == 3
    assert keras.saving.get_registered_object("tftrain>R2") is R2


def test_perplexity_streams_the_exponential_of_the_mean_cross_entropy():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(3, 4, 5)).astype(np.float32)
    labels = rng.integers(0, 5, size=(3, 4))
    metric = language_model.perplexity_metric()
    assert metric.name == "perplexity"
    metric.update_state(labels[:1], logits[:1])
    metric.update_state(labels[1:], logits[1:])
    expected = next_token_metrics(logits, labels)["perplexity"]
    assert float(metric.result()) == pytest.approx(expected, rel=1e-5)
    weighted = language_model.perplexity_metric("ppl")
    assert weighted.name == "ppl"
    weighted.update_state(labels, logits, sample_weight=np.array([1.0, 0.0, 0.0]))
    assert float(weighted.result()) == pytest.approx(
        next_token_metrics(logits[:1], labels[:1])["perplexity"], rel=1e-5)
    assert keras.saving.get_registered_object("tftrain>Perplexity") is type(metric)


def test_bits_per_byte_streams_the_cross_entropy_in_bits_over_the_bytes():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(3, 4, 5)).astype(np.float32)
    labels = rng.integers(0, 5, size=(3, 4))
    sizes = [1.0, 2.0, 3.0, 1.0, 4.0]
    metric = language_model.bits_per_byte_metric(sizes)
    assert metric.name == "bits_per_byte"
    metric.update_state(labels[:2], logits[:2])
    metric.update_state(labels[2:], logits[2:])
    expected = next_token_metrics(logits, labels, sizes)["bits_per_byte"]
    assert float(metric.result()) == pytest.approx(expected, rel=1e-5)
    # a weight per sequence: its positions count that much, in bits and in bytes
    weighted = language_model.bits_per_byte_metric(sizes, name="bpb")
    assert weighted.name == "bpb"
    weighted.update_state(labels, logits, sample_weight=np.array([0.0, 1.0, 0.0]))
    assert float(weighted.result()) == pytest.approx(
        next_token_metrics(logits[1:2], labels[1:2], sizes)["bits_per_byte"], rel=1e-5)
    config = metric.get_config()
    assert config["token_bytes"] == sizes and config["name"] == "bits_per_byte"
    assert type(metric).from_config(config).token_bytes.tolist() == sizes
    assert [v.name for v in metric.variables] == ["nats:0", "bytes:0"]
    assert keras.saving.get_registered_object("tftrain>BitsPerByte") is type(metric)


def test_a_weight_per_row_of_a_grid_of_sequences():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 2, 3, 4)).astype(np.float32)  # [batch, rows, positions, ids]
    labels = rng.integers(0, 4, size=(2, 2, 3))
    sizes = [1.0, 2.0, 1.0, 3.0]
    metric = language_model.bits_per_byte_metric(sizes)
    metric.update_state(labels, logits, sample_weight=np.array([[1.0, 0.0], [0.0, 1.0]]))
    kept = ([0, 1], [0, 1])
    assert float(metric.result()) == pytest.approx(
        next_token_metrics(logits[kept], labels[kept], sizes)["bits_per_byte"], rel=1e-5)


def test_the_metrics_keep_their_keras_arguments():
    bits_per_byte = language_model.metric_classes()["bits_per_byte"]
    assert bits_per_byte([1.0]).name == "bits_per_byte"
    metric = bits_per_byte([1, 2], dtype="float64")  # whole bytes given as ints
    assert metric.get_config()["dtype"] == "float64"
    assert metric.get_config()["token_bytes"] == [1.0, 2.0]
    assert all(type(b) is float for b in metric.get_config()["token_bytes"])
    metric.update_state(np.array([[1]]), np.array([[[0.0, 1.0]]], np.float32))
    assert float(metric.result()) == pytest.approx(-log_softmax([0.0, 1.0], 1) / LN(2) / 2)
    r2 = R2(dtype="float64")
    assert r2.get_config()["dtype"] == "float64" and r2.result().dtype == "float64"
    with pytest.raises(TypeError):
        bits_per_byte([1.0], bogus=1)
    with pytest.raises(TypeError):
        R2(bogus=1)


def test_bits_per_byte_without_bytes_and_below_one_byte():
    logits = np.array([[[0.0, 1.0]]], np.float32)
    metric = language_model.bits_per_byte_metric([0.0, 0.0])
    assert math.isnan(float(metric.result()))  # nothing seen
    metric.update_state(np.array([[1]]), logits)
    assert math.isnan(float(metric.result()))  # targets of no bytes
    quarter = language_model.bits_per_byte_metric([0.25, 0.25])
    quarter.update_state(np.array([[1]]), logits)
    bits = -log_softmax([0.0, 1.0], 1) / LN(2)
    assert float(quarter.result()) == pytest.approx(bits / 0.25, rel=1e-5)


def test_class_names_are_the_datasets_by_id_as_text():
    """The per-class measures' names: the manifest's `class_names` in id order, each as text
    (a dataset may name its classes by numbers); none recorded, none given."""
    assert ClassificationTask({"class_names": ["cat", 7, "dog"]}, num_classes=3).class_names() \
        == ["cat", "7", "dog"]
    assert ClassificationTask({}, num_classes=3).class_names() == []
    assert ClassificationTask({"class_names": None}, num_classes=3).class_names() == []

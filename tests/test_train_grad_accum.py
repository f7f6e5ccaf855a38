"""Gradient accumulation: batch B with k micro-batches trains exactly like batch k*B."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tftrain import models
from tftrain.engine import grad_accum

EXAMPLES = 96


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 10, EXAMPLES).astype("int32")
    return x, y


def _train(steps, batch, strategy, optimizer):
    x, y = _data()
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = models.build_model("cnn", {"filters": [4], "dense_units": 16, "dropout": 0},
                                   (8, 8, 1), 10)
        trainer = grad_accum.wrap(model, steps)
        trainer.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        metrics=["accuracy"])
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch * steps)
    history = trainer.fit(dataset, epochs=2, verbose=0, shuffle=False)
    return [w.numpy() for w in model.weights], history.history, trainer


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_same_weights_as_the_big_batch_with_and_without_a_strategy(optimizer):
    make = {"sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
            "adam": lambda: keras.optimizers.Adam(1e-3)}[optimizer]
    default = tf.distribute.get_strategy()
    big, big_history, _ = _train(1, 32, default, make())
    accumulated, history, trainer = _train(4, 8, default, make())
    mirrored, _, mirrored_trainer = _train(4, 8, tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
                                           make())
    assert isinstance(trainer, grad_accum.GradAccumModel)
    assert int(trainer.optimizer.iterations.numpy()) == 2 * EXAMPLES // 32  # one update per 4 batches
    assert int(mirrored_trainer.optimizer.iterations.numpy()) == 2 * EXAMPLES // 32
    keras.utils.set_random_seed(1)  # the initial weights all three runs started from
    initial = [w.numpy() for w in models.build_model(
        "cnn", {"filters": [4], "dense_units": 16, "dropout": 0}, (8, 8, 1), 10).weights]
    assert any(np.abs(a - b).max() > 1e-3 for a, b in zip(big, initial))  # it did train
    for reference, other in ((big, accumulated), (big, mirrored)):
        for a, b in zip(reference, other):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(history["loss"], big_history["loss"], rtol=1e-5)


def test_wrap_is_the_model_itself_for_one_step():
    model = models.build_model("mlp", {"hidden_units": [4]}, (8, 8, 1), 10)
    assert grad_accum.wrap(model, 1) is model


def test_a_batch_that_does_not_split_is_an_error():
    x, y = _data()
    trainer = grad_accum.wrap(models.build_model("mlp", {"hidden_units": [4]}, (8, 8, 1), 10), 4)
    trainer.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(tf.errors.InvalidArgumentError, match="grad_accum_steps=4"):
        trainer.fit(x[:30], y[:30], batch_size=30, epochs=1, verbose=0)

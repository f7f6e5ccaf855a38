"""The Transformer builders: stable layer names, causality of `transformer_lm`, padding masking
of `transformer`, what `build_model` passes them from a dataset's info, and their config
errors. Tiny models, not trained (tests/test_language_model.py trains one)."""
import numpy as np
import pytest

from tftrain import models
from tftrain.errors import ConfigError
from tftrain.models import OutputSpec

SMALL = dict(width=16, num_layers=2, num_heads=2, mlp_width=32)


def _lm(**params):
    import tf_keras as keras

    keras.utils.set_random_seed(0)
    return models.build_model("transformer_lm", {**SMALL, **params}, (12,), OutputSpec(20),
                              dataset_info={"vocab_size": 20, "sequence_length": 12})


def test_the_weights_have_stable_descriptive_names():
    names = {w.name for w in _lm().weights}
    for block in range(2):
        for part in ("query", "key", "value", "attention_output"):
            assert f"block_{block}_attention/{part}/kernel:0" in names
        assert f"block_{block}_mlp_in/kernel:0" in names
        assert f"block_{block}_mlp_out/kernel:0" in names
        assert f"block_{block}_attention_norm/gamma:0" in names
    assert {"token_embedding/embeddings:0", "position_embedding/embeddings:0",
            "final_norm/gamma:0", "logits/kernel:0"} <= names


def test_the_language_model_is_causal_and_gives_logits_per_position():
    model = _lm()
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 20, size=(1, 12)).astype(np.int32)
    changed = ids.copy()
    changed[0, 7] = (ids[0, 7] + 1) % 18 + 2
    before, after = model(ids).numpy(), model(changed).numpy()
    assert before.shape == (1, 12, 20) and before.dtype == np.float32
    np.testing.assert_allclose(before[0, :7], after[0, :7], atol=1e-5)  # the past: unchanged
    assert np.abs(before[0, 7:] - after[0, 7:]).max() > 1e-4  # from position 7 on: changed


def test_the_encoder_ignores_padding():
    import tf_keras as keras

    keras.utils.set_random_seed(0)
    model = models.build_model("transformer", {**SMALL, "dropout": 0.0}, (10,), OutputSpec(3),
                               dataset_info={"vocab_size": 30, "max_length": 10})
    assert model.output_shape == (None, 3)
    ids = np.array([[5, 6, 7, 8, 0, 0, 0, 0, 0, 0]], np.int32)
    before = model(ids).numpy()
    embedding = model.get_layer("token_embedding")
    table = embedding.get_weights()[0]
    table[0] = np.random.default_rng(1).normal(size=table.shape[1]) * 10  # the padding's row
    embedding.set_weights([table])
    np.testing.assert_allclose(model(ids).numpy(), before, atol=1e-5)
    assert np.abs(model(np.array([[5, 6, 7, 9, 0, 0, 0, 0, 0, 0]], np.int32)).numpy()
                  - before).max() > 1e-5  # a real token does count


def test_config_errors_are_clear():
    with pytest.raises(ConfigError, match="has no parameter model.params.hidden_units"):
        models.check_model("transformer_lm", {"hidden_units": [8]})
    models.check_model("transformer", {"width": 32, "num_heads": 4})
    with pytest.raises(ConfigError, match=r"model.name=transformer_lm cannot take this dataset's inputs \(one example: shape \(8, 8, 1\)\); models that can: mlp, cnn, resnet, application\."):
        models.build_model("transformer_lm", {}, (8, 8, 1), OutputSpec(10), dataset_info={})
    with pytest.raises(ConfigError, match="needs a text dataset with vocab_size"):
        models.build_model("transformer", {}, (8,), OutputSpec(10), dataset_info={})
    with pytest.raises(ConfigError, match="width=30 must be a multiple of .*num_heads=4"):
        models.build_model("transformer", {"width": 30}, (8,), OutputSpec(2),
                           dataset_info={"vocab_size": 9, "max_length": 8})

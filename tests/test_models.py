"""The model registry: built-in models, users' own builders, and clear errors."""
import numpy as np
import pytest
import tf_keras as keras

from tftrain import models
from tftrain.errors import ConfigError


@pytest.mark.parametrize("name, params", [
    ("mlp", {"hidden_units": [16]}),
    ("cnn", {"filters": [4, 8], "dense_units": 8}),
    ("resnet", {"depth": 1, "width": 4, "stages": 2}),
    ("tests.user_model:tiny", {"units": 4}),
])
def test_each_model_builds_float32_logits(name, params):
    models.check_model(name, params)
    model = models.build_model(name, params, (8, 8, 1), 10)
    assert isinstance(model, keras.Model)
    out = model(np.zeros((3, 8, 8, 1), np.float32))
    assert out.shape == (3, 10) and out.dtype == "float32"


def test_resnet_depth_and_width_are_configurable():
    small = models.build_model("resnet", {"depth": 1, "width": 4, "stages": 2}, (16, 16, 3), 5)
    large = models.build_model("resnet", {"depth": 2, "width": 8, "stages": 3}, (16, 16, 3), 5)
    assert large.count_params() > 4 * small.count_params()


def test_mixed_precision_keeps_logits_float32():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = models.build_model("cnn", {"filters": [4]}, (8, 8, 1), 10)
        assert model.layers[1].compute_dtype == "bfloat16"
        assert model(np.zeros((2, 8, 8, 1), np.float32)).dtype == "float32"
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_unknown_model_lists_registered_ones():
    with pytest.raises(ConfigError, match="unknown model 'transformr' \\(did you mean "
                                          "'transformer'\\?\\): registered models are mlp, cnn"):
        models.get_builder("transformr")
    with pytest.raises(ConfigError, match="cannot import module 'no_such_pkg.models'"):
        models.get_builder("no_such_pkg.models:build")


def test_keras3_model_is_rejected(tmp_path, monkeypatch):
    (tmp_path / "k3_model.py").write_text(
        "class Model:\n    pass\n\ndef build(input_shape, num_classes):\n    return Model()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="not a tf_keras Model"):
        models.build_model("k3_model:build", {}, (8, 8, 1), 10)

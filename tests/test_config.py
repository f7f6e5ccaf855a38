"""Config: defaults -> file -> flags -> overrides, strict keys and types, validation, params.yaml."""
import pytest
import yaml

from tftrain import config as config_lib
from tftrain.errors import ConfigError


def test_shipped_config_and_override_order(tmp_path):
    config = config_lib.build_config("digits", {"runtime.strategy": "mirrored"},
                                     "train.epochs=3,data.batch_size=64,runtime.strategy=one_device")
    assert config.model.name == "auto"  # from configs/digits.yaml (the default is cnn)
    assert config.data.batch_size == 64 and config.train.epochs == 3  # overrides
    assert config.runtime.strategy == "one_device"  # the override is applied after the flag
    flag_only = config_lib.build_config("digits", {"runtime.strategy": "mirrored"}, "")
    assert flag_only.runtime.strategy == "mirrored"


def test_exponent_floats_without_a_dot():
    config = config_lib.build_config("digits", {}, "train.learning_rate=1e-5")
    assert config.train.learning_rate == 1e-5
    with pytest.raises(ConfigError, match="'train.learning_rate' must be of type float, got 'fast'"):
        config_lib.build_config("digits", {}, "train.learning_rate=fast")


def test_yaml_file_path_and_nested_override(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("model:\n  name: mlp\n  params: {hidden_units: [32]}\ntrain:\n  learning_rate: 1\n")
    config = config_lib.build_config(str(path), {}, "model.params={hidden_units: [8, 4], dropout: 0.0}")
    assert config.model.params == {"hidden_units": [8, 4], "dropout": 0.0}
    assert config.train.learning_rate == 1.0 and isinstance(config.train.learning_rate, float)
    # A dotted key into a mapping sets that key and keeps the others (a whole mapping replaces).
    config = config_lib.build_config(str(path), {}, "model.params.dropout=0.5")
    assert config.model.params == {"hidden_units": [32], "dropout": 0.5}
    config = config_lib.build_config("text_lm", {}, "model.params.remat=true,"
                                     "data.pipeline_options.sequence_length=32")
    assert config.model.params["width"] == 64 and config.model.params["remat"] is True
    assert config.data.pipeline_options == {"sequence_length": 32}
    assert "remat: true" in config_lib.to_yaml(config)


@pytest.mark.parametrize("override, message", [
    ("train.epoch=3", "unknown config key 'train.epoch'; did you mean train.epochs"),
    ("trian.epochs=3", "did you mean train.epochs"),
    ("data.batch_size=abc", "'data.batch_size' must be of type int, got 'abc'"),
    ("data.cache=decode", "data.cache='decode' is not one of none, records, decoded (did you mean 'decoded'?)"),
    ("train.epochs=1.5", "'train.epochs' must be of type int"),
    ("runtime.strategy=mirorred", "runtime.strategy='mirorred' is not one of"),
    ("train.epochs=0", "train.epochs must be > 0, got 0"),
    ("model.name=cnnn", "unknown model 'cnnn' (did you mean 'cnn'?)"),
    ("model.params={filter: [1]}", "no model takes model.params.filter; did you mean filters"),
    ("model.name=cnn,model.params={filter: [1]}",
     "model 'cnn' has no parameter model.params.filter; did you mean filters"),
    ("runtime.strategy=tpu", "needs runtime.tpu"),
    ("epochs", "bad override 'epochs'"),
])
def test_bad_overrides_name_the_problem(override, message):
    with pytest.raises(ConfigError) as error:
        config_lib.build_config("digits", {}, override)
    assert message in str(error.value)


def test_batch_not_divisible_by_replicas_names_both_numbers():
    with pytest.raises(ConfigError, match=r"data.batch_size \(30\) must be divisible by the number "
                                          r"of replicas \(4\)"):
        config_lib.build_config("digits", {}, "runtime.strategy=mirrored,runtime.cpu_devices=4,"
                                "data.batch_size=30")


def test_missing_config_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="config 'nope' not found.*shipped configs: .*digits"):
        config_lib.build_config("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1,\n")
    with pytest.raises(ConfigError, match="bad.yaml is not valid YAML"):
        config_lib.build_config(str(bad))
    unknown_section = tmp_path / "u.yaml"
    unknown_section.write_text("trainer:\n  epochs: 1\n")
    with pytest.raises(ConfigError, match="u.yaml: unknown config key 'trainer.epochs'; did you mean train.epochs"):
        config_lib.build_config(str(unknown_section))


def test_params_yaml_round_trip(tmp_path):
    config = config_lib.build_config("digits", {}, "train.epochs=2,model.params={filters: [4]}")
    path = tmp_path / "params.yaml"
    path.write_text(config_lib.to_yaml(config))
    assert config_lib.from_yaml_file(str(path)) == config


def test_params_yaml_of_an_older_run_with_a_boolean_cache_loads(tmp_path):
    for old, mode in ((False, "none"), (True, "records")):
        params = config_lib.to_dict(config_lib.build_config("digits"))
        params["data"]["cache"] = old  # written before data.cache named what is kept
        path = tmp_path / "params.yaml"
        path.write_text(yaml.safe_dump(params))
        assert config_lib.from_yaml_file(str(path)).data.cache == mode
    assert config_lib.build_config("digits", overrides="data.cache=true").data.cache == "records"
    with pytest.raises(ConfigError, match="'train.epochs' must be of type int"):
        config_lib.build_config("digits", overrides="train.epochs=true")


def test_user_model_function_is_checked():
    config = config_lib.build_config("digits", {}, "model.name=tests.user_model:tiny,model.params={units: 4}")
    assert config.model.name == "tests.user_model:tiny"
    with pytest.raises(ConfigError, match="no function 'missing'"):
        config_lib.build_config("digits", {}, "model.name=tests.user_model:missing")


def test_a_whole_mapping_under_a_dotted_key_is_written_to_params_yaml_as_given():
    """`model.params.backbone_params={}` once left an override's own mapping type inside
    the config, which params.yaml could not hold (`tftrain train` ended in RepresenterError)."""
    from tftrain.config_schema import to_yaml

    config = config_lib.build_config("finetune", overrides="model.params.backbone_params={}")
    written = yaml.safe_load(to_yaml(config))
    assert written["model"]["params"]["backbone_params"] == {}
    assert written["model"]["params"]["backbone"] == "MobileNetV2"  # the other keys kept

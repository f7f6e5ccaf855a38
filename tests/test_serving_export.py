"""The serving export: `export/<version>/` with tensor and tf.train.Example signatures, found by
evaluate, prune and quantize; export/ of earlier tftrain versions (a SavedModel at its top)
still found."""
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from pipelines import load_pipeline
from tests.conftest import run_cli
from tests.shared_runs import text_lm_run  # noqa: F401  (a fixture)
from tftrain import config as config_lib
from tftrain import ownership
from tftrain.engine import export, run_config
from tftrain.data import foreign, reader
from tftrain.data import manifest as manifest_lib
from tftrain.optimize import runs

SMALL_MODEL = "model.params={filters: [8], dense_units: 32, dropout: 0.0}"


@pytest.fixture(scope="module")
def run(tmp_path_factory, digits_dir):
    path = tmp_path_factory.mktemp("serving") / "run"
    assert run_cli("train", f"--model_dir={path}",
                   f"--params_override=train.epochs=2,data.dir={digits_dir},{SMALL_MODEL}") == 0
    return path


def _version_dir(run):
    (version,) = [p for p in (run / "export").iterdir() if p.name.isdigit()]
    return version


def _test_records(digits_dir):
    """The raw serialized Examples of the test split, in file order."""
    files = manifest_lib.shard_files(digits_dir, manifest_lib.read(digits_dir), "test")
    return list(tf.data.TFRecordDataset(files).as_numpy_iterator())


def _without(serialized, keys):
    example = tf.train.Example.FromString(serialized)
    for key in keys:
        del example.features.feature[key]
    return example.SerializeToString()


def test_the_export_is_a_tf_serving_base_path(run):
    assert sorted(p.name for p in (run / "export").iterdir()) == \
        sorted([ownership.MARKER, _version_dir(run).name])
    assert (_version_dir(run) / "saved_model.pb").is_file()
    assert export.saved_model_dir(str(run / "export")) == str(_version_dir(run))


def test_tensor_and_example_signatures_agree_with_training(run, digits_dir):
    summary = json.loads((run / "summary.json").read_text())
    loaded = tf.saved_model.load(str(_version_dir(run)))
    assert {"serving_default", "serving_examples", "classify"} <= set(loaded.signatures)
    images, labels = next(iter(reader.load(digits_dir, "test", 1000, training=False)))
    records = _test_records(digits_dir)
    assert len(records) == len(labels)

    by_tensor = loaded.signatures["serving_default"](inputs=images)["logits"].numpy()
    by_example = {k: v.numpy() for k, v in loaded.signatures["serving_examples"](
        examples=tf.constant(records)).items()}
    np.testing.assert_allclose(by_example["logits"], by_tensor, atol=1e-5)
    np.testing.assert_allclose(by_example["probabilities"], tf.nn.softmax(by_tensor), atol=1e-5)
    np.testing.assert_array_equal(by_example["class_ids"], by_tensor.argmax(axis=1))
    np.testing.assert_array_equal(by_example["classes"],
                                  [str(i).encode() for i in by_example["class_ids"]])
    accuracy = float(np.mean(by_example["class_ids"] == labels.numpy()))
    assert accuracy == pytest.approx(summary["eval"]["accuracy"], abs=1e-6)

    # TF Serving's Classify API: `inputs` -> `classes` and `scores` of shape [batch, classes].
    classified = loaded.signatures["classify"](inputs=tf.constant(records[:5]))
    assert classified["classes"].shape == (5, 10) and classified["scores"].shape == (5, 10)
    assert [c.decode() for c in classified["classes"].numpy()[0]] == [str(i) for i in range(10)]
    np.testing.assert_allclose(classified["scores"], by_example["probabilities"][:5], atol=1e-6)

    # A request has no label (nor file name or class text): it parses and predicts the same.
    bare = [_without(r, ["image/class/label", "image/class/text", "image/filename"])
            for r in records[:7]]
    np.testing.assert_allclose(
        loaded.signatures["serving_examples"](examples=tf.constant(bare))["logits"],
        by_tensor[:7], atol=1e-5)


def test_only_what_the_inputs_read_is_required(digits_dir):
    manifest = manifest_lib.read(digits_dir)
    pipeline = load_pipeline("digits")
    spec = export.example_spec(manifest["features"], pipeline, manifest["info"])
    assert spec["image/encoded"].default_value is None  # the image: required
    assert spec["image/class/label"].default_value == 0  # the label: optional
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.parse_example(tf.constant([_without(_test_records(digits_dir)[0],
                                                  ["image/encoded"])]), spec)


def test_evaluate_prune_and_quantize_find_the_version(run, digits_dir, cli):
    summary = json.loads((run / "summary.json").read_text())
    assert cli("evaluate", f"--model={run}/export", f"--data={digits_dir}", "--split=test") == 0
    assert json.loads((run / "eval_test.json").read_text())["accuracy"] == \
        pytest.approx(summary["eval"]["accuracy"], abs=1e-6)
    assert cli("quantize", f"--model_dir={run}", "--mode=dynamic") == 0
    assert json.loads((run / "quantized/report.json").read_text())["model"] == \
        str(_version_dir(run))
    assert cli("prune", f"--model_dir={run}", "--epochs=1") == 0
    assert (run / "pruned/saved_model.pb").is_file()  # pruned/ keeps its layout


def test_an_export_of_an_earlier_version_is_still_found(run, digits_dir, cli, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    for name in ("params.yaml", "summary.json", ownership.MARKER):
        shutil.copy(run / name, old / name)
    shutil.copytree(_version_dir(run), old / "export")  # export/saved_model.pb at the top
    assert runs.model_path(str(old)) == str(old / "export")
    assert cli("evaluate", f"--model={old}/export", f"--data={digits_dir}") == 0
    assert json.loads((old / "eval_test.json").read_text())["accuracy"] == pytest.approx(
        json.loads((run / "summary.json").read_text())["eval"]["accuracy"], abs=1e-6)
    assert cli("quantize", f"--model_dir={old}", "--mode=dynamic") == 0


def test_a_new_export_takes_over_from_the_one_before(run, tmp_path):
    config = run_config.read(str(run))
    manifest = foreign.read_manifest(config.data)
    model = keras.models.load_model(str(_version_dir(run)), compile=False)
    legacy = tmp_path / "export"
    shutil.copytree(_version_dir(run), legacy)  # an earlier tftrain's layout, now re-exported
    (legacy / "notes.txt").write_text("mine")
    first = export.export(model, str(legacy), config.data, manifest)
    second = export.export(model, str(legacy), config.data, manifest)
    assert int(second.rsplit("/", 1)[1]) > int(first.rsplit("/", 1)[1])
    # The older version and the earlier layout's files are gone; a file tftrain did not write stays.
    assert sorted(p.name for p in legacy.iterdir()) == \
        sorted([ownership.MARKER, "notes.txt", second.rsplit("/", 1)[1]])


def test_a_decode_that_cannot_be_exported_leaves_the_tensor_signature(monkeypatch, tmp_path,
                                                                       digits_dir):
    def untraceable(*args):
        raise TypeError("decode uses a tf.py_function")

    monkeypatch.setattr(export, "example_signatures", untraceable)
    config = config_lib.Config()
    config.data.dir = digits_dir
    model = keras.Sequential([keras.layers.Flatten(input_shape=(8, 8, 1)), keras.layers.Dense(10)])
    path = export.export(model, str(tmp_path / "export"), config.data,
                         manifest_lib.read(digits_dir))
    assert set(tf.saved_model.load(path).signatures) == {"serving_default"}


PLAIN_LOAD = """
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np, tf_keras
classes = {}
for model_dir, inputs, outputs in zip(*[iter(sys.argv[1:])] * 3):
    model = tf_keras.models.load_model(model_dir)
    np.save(outputs, model(np.load(inputs)).numpy())
    classes[model_dir] = sorted({f"{type(layer).__module__}.{type(layer).__name__}"
                                 for layer in model.submodules})
assert not any(name.startswith(("tftrain", "pipelines")) for name in sys.modules)
print(json.dumps(classes))
"""


def test_plain_tf_keras_loads_the_export_without_tftrain(run, text_lm_run, tmp_path):
    """A model of built-in layers is saved without layer traces (rebuilt from its config), and
    so is a Transformer, whose attention layers are saved as the tf-keras classes they extend;
    a model with other layers keeps its traces. Either way a process that never imports
    tftrain loads it, and computes what tftrain's model computes; tftrain loads the
    Transformer's attention back as its own MatMul layer."""
    import subprocess
    import sys

    import tensorflow_model_optimization as tfmot
    from tftrain.models import attention

    images = np.random.default_rng(0).random([4, 8, 8, 1], np.float32)
    tokens = np.random.default_rng(0).integers(1, 60, [2, 64]).astype(np.int32)
    trained = export.load_keras_model(str(_version_dir(run)))
    assert not export.needs_traces(trained)
    wrapped = tfmot.sparsity.keras.prune_low_magnitude(keras.models.clone_model(trained))
    assert export.needs_traces(wrapped)
    export.save_saved_model(wrapped, str(tmp_path / "wrapped"))
    transformer = export.load_keras_model(str(_version_dir(text_lm_run)))
    assert not export.needs_traces(transformer)
    assert {type(layer) for layer in transformer.submodules} >= set(
        attention.saved_classes().values())
    cases = [(_version_dir(run), trained, images), (tmp_path / "wrapped", wrapped, images),
             (_version_dir(text_lm_run), transformer, tokens)]
    args = []
    for i, (path, _, inputs) in enumerate(cases):
        np.save(tmp_path / f"in{i}.npy", inputs)
        args += [str(path), str(tmp_path / f"in{i}.npy"), str(tmp_path / f"out{i}.npy")]
    done = subprocess.run([sys.executable, "-c", PLAIN_LOAD, *args], capture_output=True,
                          text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for i, (_, model, inputs) in enumerate(cases):
        np.testing.assert_allclose(np.load(tmp_path / f"out{i}.npy"), model(inputs).numpy(),
                                   rtol=1e-5, atol=1e-5)
    classes = json.loads(done.stdout.strip().splitlines()[-1])[str(_version_dir(text_lm_run))]
    assert ("tf_keras.src.layers.attention.multi_head_attention.MultiHeadAttention" in classes
            and all(name.startswith("tf_keras.src.layers.") or name.startswith(
                "tf_keras.src.engine.") for name in classes)), classes


def test_a_model_from_elsewhere_keeps_tf_keras_multi_head_attention(tmp_path):
    """Only a SavedModel tftrain wrote gets its MatMul attention back: a user's model of
    tf-keras's MultiHeadAttention loads as that layer, which TFMOT can prune."""
    from tftrain.models import attention
    from tftrain.optimize.tfmot_lib import prune_registry

    inputs = keras.Input((6, 8))
    outputs = keras.layers.MultiHeadAttention(2, 4, name="attention")(inputs, inputs)
    model = keras.Model(inputs, outputs)
    model.save(str(tmp_path / "theirs"), save_format="tf")
    export.save_saved_model(model, str(tmp_path / "ours"))  # tftrain's save: its marker
    theirs = export.load_keras_model(str(tmp_path / "theirs")).get_layer("attention")
    ours = export.load_keras_model(str(tmp_path / "ours")).get_layer("attention")
    assert type(theirs) is keras.layers.MultiHeadAttention
    assert prune_registry.PruneRegistry.supports(theirs)
    assert type(ours) is attention.attention_class()

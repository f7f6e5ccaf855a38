"""Text classification end to end: the jsonl pipeline's embedded default (Unicode character
names, 5 classes), a `transformer` trained by the shipped config (1 of its 5 epochs), the
export's raw-string signature against the model on the tokenized ids, and `tftrain evaluate`
on the export."""
import glob
import json
import unicodedata
from collections import Counter

import numpy as np
import pytest

from pipelines.jsonl import EMBEDDED_CLASSES, EMBEDDED_PER_CLASS, embedded_records
from tests import documented
from tests.conftest import run_cli
from tests.pipeline_testutil import load_all
from tftrain.engine import export

CHANCE = 1 / len(EMBEDDED_CLASSES)


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """The config's `Run:` header command as written, in a fresh directory, for 1 of its 5
    epochs (37 steps of 64 names); its dataset converted by the default path (no dataset yet:
    the embedded records). Returns (run dir, data dir)."""
    root = tmp_path_factory.mktemp("text_classification")
    args = documented.args(
        "tftrain train --config=text_classification --model_dir=runs/text_classification")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # where the default path converts data/text_classification
        assert run_cli(*args, "--params_override=train.epochs=1") == 0
    return root / "runs/text_classification", root / "data/text_classification"


def test_the_embedded_records_are_balanced_unicode_names():
    records = embedded_records()
    assert Counter(r["label"] for r in records) == {
        name: EMBEDDED_PER_CLASS for name in EMBEDDED_CLASSES.values()}
    for record in records:  # each name's character is of its label's category
        major = unicodedata.category(unicodedata.lookup(record["text"]))[0]
        assert EMBEDDED_CLASSES[major] == record["label"], record
    assert len({r["text"] for r in records}) == len(records)


def test_the_transformer_learns_the_classes(text_run):
    run, data_dir = text_run
    summary = json.loads((run / "summary.json").read_text())
    info = json.loads((data_dir / "dataset.json").read_text())["info"]
    assert info["tokenizer"] == "TextVectorization" and info["source"] == "unicodedata"
    assert info["class_names"] == sorted(EMBEDDED_CLASSES.values())
    # 0.744 measured after the one epoch (0.79 after two), chance 0.2: 0.6 keeps a margin.
    assert summary["eval"]["accuracy"] > CHANCE + 0.4, summary["eval"]


def test_the_export_takes_raw_strings_and_gives_the_models_logits(text_run):
    import tensorflow as tf
    import tf_keras as keras

    run, data_dir = text_run
    path = export.saved_model_dir(str(run / "export"))
    ids, labels = load_all(data_dir, "test")  # the training reader's token ids, file order
    shards = sorted(glob.glob(str(data_dir / "test-*.tfrecord")))
    texts = [tf.io.parse_single_example(r, {"text": tf.io.FixedLenFeature([], tf.string)})
             ["text"].numpy() for r in tf.data.TFRecordDataset(shards)]
    assert len(texts) == len(ids) and len(shards) == 1

    expected = keras.models.load_model(path, compile=False)(ids, training=False).numpy()
    serving = tf.saved_model.load(path).signatures
    assert export.TEXT_SIGNATURE in serving and "serving_default" in serving
    served = serving[export.TEXT_SIGNATURE](text=tf.constant(texts))
    np.testing.assert_allclose(served["logits"].numpy(), expected, rtol=1e-5, atol=1e-5)
    assert served["class_ids"].numpy().tolist() == expected.argmax(-1).tolist()
    names = json.loads((data_dir / "dataset.json").read_text())["info"]["class_names"]
    assert served["classes"].numpy()[0].decode() == names[expected[0].argmax()]
    assert (served["class_ids"].numpy() == labels).mean() > CHANCE + 0.4
    one = serving[export.TEXT_SIGNATURE](text=tf.constant(["DIGIT SEVEN"]))["logits"]
    assert one.shape == (1, len(names))


def test_tftrain_evaluate_on_the_export(text_run, capsys):
    run, data_dir = text_run
    summary = json.loads((run / "summary.json").read_text())
    args = documented.args(  # the config's `Evaluate:` header command
        "tftrain evaluate --model=runs/text_classification/export "
        "--data=data/text_classification --split=test")
    assert run_cli(*documented.replaced(args, model=str(run / "export"),
                                        data=str(data_dir))) == 0
    printed = capsys.readouterr().out
    assert f"accuracy={summary['eval']['accuracy']:.4f}" in printed, printed

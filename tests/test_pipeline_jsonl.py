"""jsonl: a TextVectorization vocabulary adapted at conversion time over the training split,
the same layer at decode time, old datasets' tokenization kept, bad lines, trainable ids."""
import json
import re

import numpy as np
import pytest
import tf_keras as keras

from pipelines import Row, load_pipeline
from pipelines.jsonl import FIRST_WORD_ID, OOV_ID
from tests.pipeline_testutil import assert_trains, bad_row_reason, convert, load_all
from tftrain.data.splits import assign_split
from tftrain.errors import ConfigError

GOOD = ["great", "good", "lovely", "fine"]
BAD = ["awful", "bad", "poor", "boring"]
FILLER = ["the", "movie", "was", "a", "plot", "and", "it", "really"]


def make_lines(n, seed=0):
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        positive = bool(rng.integers(2))
        words = list(rng.choice(FILLER, 5)) + list(rng.choice(GOOD if positive else BAD, 2))
        rng.shuffle(words)
        lines.append({"text": " ".join(words).capitalize() + "!", "label": "pos" if positive else "neg"})
    return lines


def write_jsonl(path, records, extra_lines=()):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return path


def adapted_vocabulary(texts, vocab_size, max_length):
    """What TextVectorization adapts to over `texts` (padding and OOV left out)."""
    layer = keras.layers.TextVectorization(max_tokens=vocab_size,
                                           output_sequence_length=max_length)
    layer.adapt(texts)
    return layer.get_vocabulary()[FIRST_WORD_ID:]


def test_vocabulary_is_textvectorizations_over_the_training_split(tmp_path):
    records = make_lines(40) + [{"text": "Hello, WORLD!\tIt's the café-time... GREAT",
                                 "label": "pos"}]
    src = write_jsonl(tmp_path / "reviews.jsonl", records)
    manifest = convert("jsonl", src, tmp_path / "out", splits={"train": 1.0}, num_shards=1,
                       vocab_size=12, max_length=6)
    info = manifest["info"]
    assert info["class_names"] == ["neg", "pos"] and info["num_classes"] == 2
    assert info["vocab_size"] == 12 and len(info["vocabulary"]) == 10 and info["max_length"] == 6
    assert info["tokenizer"] == "TextVectorization"
    assert info["standardize"] == "lower_and_strip_punctuation"
    assert manifest["features"] == {"text": {"dtype": "string", "shape": []},
                                    "label": {"dtype": "int64", "shape": []}}
    # adapted over the training split's rows: here (--splits=train:1.0) all of them
    assert info["vocabulary"] == adapted_vocabulary([r["text"] for r in records], 12, 6)

    ids, labels = load_all(tmp_path / "out", "train")
    assert ids.shape == (41, 6) and ids.dtype == np.int32
    layer = keras.layers.TextVectorization(vocabulary=info["vocabulary"],
                                           output_sequence_length=6)
    assert ids.tolist() == layer([r["text"] for r in records]).numpy().tolist()  # file order
    index = {word: FIRST_WORD_ID + i for i, word in enumerate(info["vocabulary"])}
    words = ["hello", "world", "its", "the", "cafétime", "great"]  # punctuation stripped
    assert ids[-1].tolist() == [index.get(w, OOV_ID) for w in words]
    assert labels.tolist() == [info["class_names"].index(r["label"]) for r in records]


@pytest.mark.parametrize("splits", [None, {"train": 0.5, "test": 0.5}])
def test_no_validation_or_test_word_enters_the_vocabulary(tmp_path, splits):
    """Each row has a word of its own: the vocabulary holds exactly the training rows' words,
    whether the rows are split by default or re-split with --splits."""
    records = [{"text": f"common word{i}", "label": i % 2} for i in range(40)]
    src = write_jsonl(tmp_path / "rows.jsonl", records)
    manifest = convert("jsonl", src, tmp_path / "out", splits=splits, num_shards=1)
    fractions = splits or {"train": 0.8, "validation": 0.1, "test": 0.1}
    train = [r["text"] for i, r in enumerate(records, start=1)
             if assign_split(f"rows.jsonl:{i}", fractions) == "train"]
    assert 0 < len(train) < len(records)
    assert manifest["splits"]["train"]["num_examples"] == len(train)
    assert sorted(manifest["info"]["vocabulary"]) == sorted(
        {"common"} | {text.split()[1] for text in train})


def test_datasets_converted_before_keep_their_tokenization(tmp_path):
    """An info without `tokenizer` (the hand-written word lookup's) decodes as it did:
    lowercase, ASCII punctuation -> space, whitespace split, its own vocabulary."""
    import tensorflow as tf

    info = {"vocabulary": ["it", "s", "café", "time", "great"], "vocab_size": 7,
            "max_length": 8, "lowercase": True, "num_classes": 2}
    text = "It's the café-time... GREAT"
    ids, label = load_pipeline("jsonl").decode(
        {"text": tf.constant([text]), "label": tf.constant([1], tf.int64)}, info)
    words = re.sub(r"[!-/:-@\[-`{-~]", " ", text.lower()).split()
    index = {word: FIRST_WORD_ID + i for i, word in enumerate(info["vocabulary"])}
    expected = [index.get(w, OOV_ID) for w in words]
    assert ids.dtype == tf.int32 and label.numpy().tolist() == [1]
    assert ids.numpy().tolist() == [expected + [0] * (8 - len(expected))]
    assert expected == [2, 3, 1, 4, 5, 6]


def test_bad_lines_are_skipped_with_reasons(tmp_path):
    bad = ['{"text": "no closing brace", "label": 1', '{"label": 1}', '{"text": "   ", "label": 0}',
           '{"text": "no label"}', '{"text": 42, "label": 1}', '{"text": "x", "label": {"a": 1}}',
           '["a", "list"]', '{"text": "negative class", "label": -1}']
    records = [{"text": f"line {i} words", "label": i % 3} for i in range(40)]
    src = write_jsonl(tmp_path / "data.jsonl", records, extra_lines=["", *bad])
    manifest = convert("jsonl", src, tmp_path / "out", splits={"train": 1.0})
    assert manifest["info"]["num_classes"] == 3  # integer labels: ids as written
    assert manifest["bad_rows"]["count"] == len(bad) and manifest["splits"]["train"]["num_examples"] == 40
    bad_rows = [json.loads(line) for line in (tmp_path / "out" / "bad_rows.jsonl").read_text().splitlines()]
    assert len(bad_rows) == len(bad)

    pipeline = load_pipeline("jsonl")
    info = manifest["info"]
    reasons = [bad_row_reason(pipeline, Row(str(i), line), info) for i, line in enumerate(bad)]
    assert reasons[0].startswith("invalid JSON")
    assert reasons[1] == "missing text key 'text'"
    assert reasons[2] == "empty text in 'text'"
    assert reasons[3] == "missing label 'label'"
    assert "is a int, not a string" in reasons[4]
    assert "neither an integer class id nor a class name" in reasons[5]
    assert "expected a JSON object" in reasons[6]
    assert "not a class id in 0..2" in reasons[7]


def test_custom_keys_source_splits_and_parallel_workers(tmp_path):
    for split, n in (("train", 30), ("validation", 10)):
        write_jsonl(tmp_path / "src" / f"{split}.jsonl",
                    [{"body": r["text"], "y": r["label"]} for r in make_lines(n, seed=len(split))])
    manifest = convert("jsonl", tmp_path / "src", tmp_path / "out", workers=2, text_key="body",
                       label_key="y", lowercase="false")
    assert {k: v["num_examples"] for k, v in manifest["splits"].items()} == {"train": 30, "validation": 10}
    assert manifest["workers"] == 2
    assert "The" in manifest["info"]["vocabulary"] or "A" in manifest["info"]["vocabulary"]
    ids, _ = load_all(tmp_path / "out", "validation")
    assert ids.shape == (10, 128) and (ids[:, 0] > OOV_ID).all()
    with pytest.raises(ConfigError, match="no valid"):
        load_pipeline("jsonl").prepare(str(tmp_path / "src"))


def test_a_keras_model_trains_on_the_token_ids(tmp_path):
    src = write_jsonl(tmp_path / "reviews.jsonl", make_lines(640))
    manifest = convert("jsonl", src, tmp_path / "out", splits={"train": 1.0}, max_length=16)
    assert_trains(tmp_path / "out", lambda: [
        keras.layers.Input([16], dtype="int32"),
        keras.layers.Embedding(manifest["info"]["vocab_size"], 8),
        keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])


def test_the_vocabulary_sample_is_bounded_and_seeded():
    from pipelines.text_sample import TextSample

    small = TextSample(max_bytes=100)
    for text in ("a b", "c d"):
        small.add(text)
    assert small.texts == ["a b", "c d"] and not small.describe()["sampled"]
    samples = []
    for _ in range(2):
        sample = TextSample(max_bytes=1000)
        for index in range(10_000):
            sample.add(f"text {index:05d}")  # 10 bytes each: 101 fit, then a reservoir of 101
        samples.append(sample.texts)
    assert len(samples[0]) == 101 and samples[0] == samples[1]  # bounded, and seeded
    assert max(int(t.split()[1]) for t in samples[0]) > 5_000  # late texts are drawn too
    assert sample.describe() == {"texts": 101, "of_texts": 10_000, "max_mb": 0, "seed": 0,
                                 "sampled": True}


def test_a_corpus_over_the_sample_bound_converts_with_a_sampled_vocabulary(tmp_path):
    """Over `vocab_sample_mb` of training text the vocabulary comes from a sample: the frequent
    words are all there, and the manifest says how many texts it saw of how many."""
    lines = make_lines(60_000)  # ~2.5 MB of text, ~2 MB of it in the training split
    source = write_jsonl(tmp_path / "reviews.jsonl", lines)
    info = convert("jsonl", str(source), tmp_path / "data", vocab_sample_mb=1)["info"]
    sample = info["vocabulary_sample"]
    assert sample["sampled"] and sample["texts"] < sample["of_texts"], sample
    assert set(w.lower() for w in GOOD + BAD + FILLER) <= set(info["vocabulary"])

"""Language modeling end to end: the `text` pipeline (embedded Python documentation and .txt
files), a `transformer_lm` trained by the shipped config (half its steps), its perplexity
against a unigram model of the same tokens, the export, `tftrain evaluate` and `tftrain
generate`."""
import glob
import json
import math
import shutil
from collections import Counter

import numpy as np
import pytest
import yaml

from pipelines import load_pipeline
from pipelines.text import (END_ID, FIRST_TOKEN_ID, OOV_ID, Characters, build_vocabulary,
                           embedded_text)
from tests import documented
from tests.conftest import run_cli
from tests.pipeline_testutil import convert, load_all
from tests.shared_runs import text_lm_run  # noqa: F401  (a fixture)
from tftrain import config as config_lib
from tftrain import tasks
from tftrain.errors import DataError


@pytest.fixture(scope="module")
def lm_run(text_lm_run):
    """The shipped config, trained for 60 steps of 64 windows (2 of its 4 epochs): the run
    tests/test_bits_per_byte.py asks questions of too (`tests/shared_runs.py`; read-only)."""
    return text_lm_run


def unigram_perplexity(text_dir) -> float:
    """The test split's perplexity under the training split's token frequencies (add-one)."""
    vocab_size = json.loads((text_dir / "dataset.json").read_text())["info"]["vocab_size"]
    counts = np.bincount(load_all(text_dir, "train", 512)[1].reshape(-1), minlength=vocab_size)
    probabilities = (counts + 1.0) / (counts.sum() + vocab_size)
    test = load_all(text_dir, "test", 512)[1].reshape(-1)
    return math.exp(-np.log(probabilities[test]).mean())


def test_the_embedded_text_is_cut_into_windows_with_a_character_vocabulary(text_dir):
    manifest = json.loads((text_dir / "dataset.json").read_text())
    info = manifest["info"]
    assert manifest["features"] == {"tokens": {"dtype": "int64", "shape": [65]}}
    assert info["vocab_size"] == len(info["vocabulary"]) + FIRST_TOKEN_ID
    assert info["sequence_length"] == 64 and info["source"] == "pydoc_data.topics"
    counts = {k: v["num_examples"] for k, v in manifest["splits"].items()}
    assert 0.7 < counts["train"] / sum(counts.values()) < 0.9 and counts["test"] > 300
    inputs, targets = load_all(text_dir, "validation")
    assert inputs.shape == targets.shape == (counts["validation"], 64)
    assert inputs.dtype == np.int32 and (inputs[:, 1:] == targets[:, :-1]).all()
    characters, text = Characters(info), embedded_text()
    train_inputs = load_all(text_dir, "train")[0]  # (validation may hold characters train lacks)
    for window in train_inputs[:200]:  # the text's characters in order, passages ended by END_ID
        for passage in np.split(window, np.flatnonzero(window == END_ID)):
            assert characters.decode(passage) in text
    # packed: every character in a window but a split's last partial window, plus END_IDs
    tokens = sum(counts.values()) * 65
    ends = sum(int((load_all(text_dir, split)[1] == END_ID).sum()) for split in counts)
    assert len(text) - 3 * 65 < tokens - ends <= len(text)
    assert not (train_inputs == OOV_ID).any() and (inputs > 0).all()  # no padding


def test_splits_are_contiguous_passages_packed_per_split(tmp_path):
    text = "".join(f"line {i}: the quick brown fox.\n" for i in range(400))
    (tmp_path / "a.txt").write_text(text)
    convert("text", tmp_path / "a.txt", tmp_path / "out", num_shards=1, workers=1,
            sequence_length=15, block_windows=4)
    pipeline = load_pipeline("text", sequence_length=15, block_windows=4)
    info = pipeline.prepare(str(tmp_path / "a.txt"))
    rows = list(pipeline.read(str(tmp_path / "a.txt"), info))
    characters, passages = Characters(info), []
    for split in ("train", "validation", "test"):
        stream = sum((row.value for row in rows if row.split == split), [])
        assert all(len(row.value) == 16 for row in rows)  # full windows, nothing padded
        for passage in np.split(np.array(stream), np.flatnonzero(np.array(stream) == END_ID)):
            passage = characters.decode(passage)
            assert passage in text
            passages.append(passage)
    # the passages of the three splits tile the text but for each split's dropped tail
    assert len(text) - 3 * 16 < sum(map(len, passages)) <= len(text)
    manifest = json.loads((tmp_path / "out" / "dataset.json").read_text())
    by_split = {s: sum(r.split == s for r in rows) for s in ("train", "validation", "test")}
    assert {s: v["num_examples"] for s, v in manifest["splits"].items()} == {
        s: n for s, n in by_split.items() if n}


def test_convert_cli_keeps_split_files_and_reports_bad_lines(tmp_path, cli):
    source = tmp_path / "books"
    source.mkdir()
    (source / "train.txt").write_bytes(b"hello world, hello text.\n" * 40 + b"\xff\xfe bad\n")
    (source / "test.txt").write_text("a test of the text pipeline.\n" * 10)
    assert cli("convert", "--pipeline=text", f"--input={source}", f"--output={tmp_path / 'd'}",
               "--pipeline_options=sequence_length=31", "--workers=1",
               "--max_bad_fraction=0.1") == 0
    manifest = json.loads((tmp_path / "d" / "dataset.json").read_text())
    assert set(manifest["splits"]) == {"train", "test"}
    assert manifest["splits"]["train"]["num_examples"] == 40 * 25 // 32
    assert manifest["splits"]["test"]["num_examples"] == 10 * 29 // 32
    assert manifest["bad_rows"]["count"] == 1
    (bad,) = [json.loads(line) for line in (tmp_path / "d" / "bad_rows.jsonl").read_text()
              .splitlines()]
    assert bad["key"] == "train.txt:line 41" and "not UTF-8" in bad["reason"]


def test_the_vocabulary_is_the_one_text_vectorization_adapts_to():
    import tf_keras as keras

    text = "".join(char * count for char, count in zip("e t\nx!", range(8, 2, -1)))
    layer = keras.layers.TextVectorization(split="character", standardize=None)
    layer.adapt([text])
    adapted = layer.get_vocabulary()[2:]  # after '' and '[UNK]'
    # distinct counts (8 "e", 7 " ", ..., 3 "!"): one frequency order, whitespace included
    assert build_vocabulary(Counter(text), vocab_size=FIRST_TOKEN_ID + 6) == adapted == (
        list("e t\nx!"))


def test_task_auto_is_language_model_and_other_tasks_are_refused(text_dir, digits_dir):
    text_manifest = json.loads((text_dir / "dataset.json").read_text())
    config = config_lib.build_config("text_lm", overrides=f"data.dir={text_dir}")
    resolved, task = tasks.resolve(config, text_manifest)
    assert task.name == "language_model" and resolved.train.monitor == "val_loss"
    assert task.outputs().size == text_manifest["info"]["vocab_size"]
    for other in ("classification", "regression"):
        config.task.type = other
        with pytest.raises(DataError, match="task.type=language_model"):
            tasks.from_config(config, text_manifest)
    digits = config_lib.build_config("digits", overrides=f"data.dir={digits_dir},"
                                     "task.type=language_model")
    with pytest.raises(DataError, match="convert text with `tftrain convert --pipeline=text`"):
        tasks.from_config(digits, json.loads(open(f"{digits_dir}/dataset.json").read()))


def test_language_model_on_an_image_dataset_is_one_line(digits_dir, tmp_path, capsys):
    code = run_cli("train", f"--model_dir={tmp_path / 'run'}", "--params_override="
                   f"data.dir={digits_dir},task.type=language_model")
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "task.type=language_model needs" in err[0], err


def test_the_trained_model_beats_a_unigram_model_of_the_same_tokens(lm_run, text_dir):
    summary = json.loads((lm_run / "summary.json").read_text())
    params = yaml.safe_load((lm_run / "params.yaml").read_text())
    assert summary["task"] == params["task"] == {"type": "language_model", "loss": "crossentropy",
                                                 "label_smoothing": 0.0}
    test = summary["eval"]
    assert set(test) >= {"loss", "perplexity", "accuracy"}
    assert math.isclose(test["perplexity"], math.exp(test["loss"]), rel_tol=1e-3)
    unigram = unigram_perplexity(text_dir)
    print(f"test perplexity: transformer_lm {test['perplexity']:.2f}, unigram {unigram:.2f}; "
          f"next-token accuracy {test['accuracy']:.3f}")
    assert test["perplexity"] <= 0.7 * unigram, (test, unigram)
    assert test["accuracy"] > 0.2
    # text_lm clips at 1.0 (its header); every update is measured, clipped or not
    gradients = summary["gradients"]
    assert params["train"]["clip_global_norm"] == gradients["clip_global_norm"] == 1.0
    assert gradients["clipped_fraction"] == pytest.approx(
        gradients["clipped_steps"] / summary["steps"], abs=1e-6)
    assert gradients["max_norm"] >= gradients["last_norm"] > 0


def test_the_export_loads_predicts_and_evaluates_with_the_task_metrics(lm_run, text_dir, cli,
                                                                       capsys, tmp_path):
    import tensorflow as tf

    (version,) = glob.glob(str(lm_run / "export" / "[0-9]*"))
    inputs, _ = load_all(text_dir, "test", 8)
    loaded = tf.saved_model.load(version)
    logits = loaded.signatures["serving_default"](inputs=tf.constant(inputs[:4]))["logits"]
    vocab_size = json.loads((text_dir / "dataset.json").read_text())["info"]["vocab_size"]
    assert logits.shape == (4, 64, vocab_size)
    records = [r.numpy() for r in tf.data.TFRecordDataset(
        sorted(glob.glob(str(text_dir / "test-*.tfrecord")))).take(2)]
    from_examples = loaded.signatures["serving_examples"](examples=tf.constant(records))
    assert from_examples["logits"].shape == (2, 64, vocab_size)

    capsys.readouterr()
    own = tmp_path / "run"  # the run is shared read-only: its export, copied, gets the result
    shutil.copytree(lm_run / "export", own / "export")
    args = documented.args(  # text_lm's `Evaluate:` header command
        "tftrain evaluate --model=runs/text_lm/export --data=data/text_lm --split=test")
    assert cli(*documented.replaced(args, model=str(own / "export"), data=str(text_dir))) == 0
    evaluated = json.loads((own / "eval_test.json").read_text())  # beside the export
    summary = json.loads((lm_run / "summary.json").read_text())
    assert evaluated["task"] == "language_model"
    assert math.isclose(evaluated["perplexity"], summary["eval"]["perplexity"], rel_tol=1e-3)
    assert math.isclose(evaluated["accuracy"], summary["eval"]["accuracy"], abs_tol=1e-4)


def test_quantize_converts_the_model_without_the_vocabulary_table_of_the_export(
        lm_run, text_dir, cli, tmp_path):
    """The export carries the character vocabulary's lookup table (its text signature uses
    it), which no TFLite builtin op holds; the model does not use it, and its .tflite converts
    (a conversion through the export's Keras objects carried the table and failed)."""
    own = tmp_path / "run"  # the shared run is read-only: a copy gets quantized/
    shutil.copytree(lm_run / "export", own / "export")
    params = yaml.safe_load((lm_run / "params.yaml").read_text())
    params["data"]["dir"] = str(text_dir)  # the same records (text_lm_run checks them)
    (own / "params.yaml").write_text(yaml.safe_dump(params))
    assert cli("quantize", f"--model_dir={own}", "--mode=dynamic", "--steps=1") == 0
    report = json.loads((own / "quantized" / "report_dynamic.json").read_text())
    assert report["reference"] == "tflite" and report["num_examples"] == 64
    assert report["perplexity"] <= 0.7 * unigram_perplexity(text_dir), report
    assert abs(report["metric_change"]) <= 0.05, report


def test_generate_continues_the_prompt_greedily_and_by_sampling(lm_run, cli, capsys):
    texts = []
    for args in (["--temperature=0"], ["--seed=3", "--top_k=10"], ["--seed=3", "--top_k=10"]):
        capsys.readouterr()
        assert cli("generate", f"--model_dir={lm_run}", "--prompt=The ", "--max_tokens=40",
                   *args) == 0
        texts.append(capsys.readouterr().out[:-1])  # print's newline
    assert texts[1] == texts[2]  # a seed gives the same text
    for text in texts:  # 40 characters, fewer when the model ends the document first
        assert text.startswith("The ") and len("The ") < len(text) <= len("The ") + 40
    capsys.readouterr()
    args = documented.args(  # text_lm's `Generate:` header command
        'tftrain generate --model_dir=runs/text_lm --prompt="The " --max_tokens=80 --seed=1')
    assert cli(*documented.replaced(args, model_dir=str(lm_run))) == 0
    text = capsys.readouterr().out[:-1]
    assert text.startswith("The ") and len("The ") < len(text) <= len("The ") + 80


@pytest.mark.parametrize("case", ["no_run", "not_lm", "empty_prompt"])
def test_generate_bad_input_is_one_line(case, tmp_path, capsys):
    run = tmp_path / "run"
    prompt = "--prompt=x"
    if case == "not_lm":  # a classifier's run: its params.yaml says so
        run.mkdir()
        (run / "params.yaml").write_text(config_lib.to_yaml(config_lib.build_config(
            "digits", overrides="task.type=classification")))
    elif case == "empty_prompt":
        prompt = "--prompt="
    code = run_cli("generate", f"--model_dir={run}", prompt)
    err = capsys.readouterr().err.strip().splitlines()
    expected = {"no_run": "is not a tftrain run", "not_lm": "trained a classification model",
                "empty_prompt": "--prompt is empty"}[case]
    assert code != 0 and len(err) == 1 and expected in err[0], err


def test_next_token_is_greedy_at_temperature_0_and_never_padding():
    from tftrain.engine.generate import next_token

    rng = np.random.default_rng(0)
    logits = np.array([9.0, 9.0, 1.0, 3.0, 2.0])  # ids 0 (padding) and 1 (unknown): never
    assert next_token(logits, 0.0, 0, rng) == 3
    assert {next_token(logits, 1.0, 2, rng) for _ in range(200)} == {3, 4}  # top 2 only
    assert {next_token(logits, 5.0, 0, rng) for _ in range(300)} == {2, 3, 4}

"""Subword tokens (`tokenizer=sentencepiece`) and packed documents, through the CLI.

The text pipeline's default path (the embedded Python documentation) converted with a
SentencePiece model, the model kept beside the shards and hashed in the manifest, the ids in
the records; the shipped `text_lm_subword` config trained, evaluated, generating text and
serving raw text whose in-graph ids are the reader's; a user's own .txt directory; the jsonl
pipeline's subword classification; and what is refused.
"""
import glob
import hashlib
import json
import re

import numpy as np
import pytest

from pipelines import subwords
from pipelines.text import END_ID, embedded_text
from tests import documented, forked_cli
from tests.conftest import REPO
from tests.pipeline_testutil import load_all

# Every source converted here is small: `tftrain convert` gives it one worker and converts it in
# its own process either way (`shard_plan`; the same shards, byte for byte). --workers=1 says so
# before the source is read, so the command does not also start the workers' server, whose
# TensorFlow import (~3.5 s of CPU) a forked command cannot share with the test's server.
ONE_WORKER = "--workers=1"
HARD_TEXTS = ["naïve café — ünïcode ✓ 日本語 𝔘𝔫𝔦", "", " ", "x" * 20_000,
              "line one\n\tindented line two\r\n", "🙂" * 300]


def tftrain(*args, cwd=REPO, check=True):
    """`tftrain <args>` as a process (forked from one that imported TensorFlow once:
    `tests/forked_cli.py`), its output captured, stdin empty."""
    done = forked_cli.run(list(args), cwd=cwd, timeout=600)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def subword_run(tmp_path_factory):
    """text_lm_subword's `Run:` header command as written, from a fresh directory (it
    converts the embedded text on first use), with fewer steps; its `Evaluate:` and
    `Generate:` commands run on it below, as written."""
    cwd = tmp_path_factory.mktemp("user")
    tftrain(*documented.args("tftrain train --config=text_lm_subword "
                             "--model_dir=runs/text_lm_subword"),
            "--params_override=train.epochs=1,train.steps_per_epoch=20", cwd=cwd)
    return cwd


def _model(data_dir) -> bytes:
    return (data_dir / "tokenizer.model").read_bytes()


def test_the_model_is_kept_beside_the_shards_and_the_records_hold_its_ids(subword_run):
    data = subword_run / "data/text_lm_subword"
    manifest = json.loads((data / "dataset.json").read_text())
    info, model = manifest["info"], _model(data)
    assert manifest["assets"] == [{"file": "tokenizer.model", "bytes": len(model),
                                   "sha256": hashlib.sha256(model).hexdigest()}]
    assert info["tokenizer"] == "sentencepiece" and info["vocab_size"] == 1024
    assert info["vocabulary_sample"]["texts"] > 0 and len(info["token_bytes"]) == 1024
    inputs, targets = load_all(data, "train")
    windows = np.concatenate([inputs, targets[:, -1:]], axis=1)
    assert windows.shape[1] == 65 and (windows > 0).all()  # packed: full windows, no padding
    assert (windows == END_ID).any()  # passages end with the end-of-document id
    tokenizer, text = subwords.Subwords(model), embedded_text()
    for window in windows[:50]:
        for passage in np.split(window, np.flatnonzero(window == END_ID)):
            assert tokenizer.decode(passage) in text  # ids of the source text, in order
    described = tftrain("inspect", f"--data={data}").stdout
    assert "tokenizer: sentencepiece, 1024 ids" in described


def test_in_graph_tokenization_gives_the_reader_ids(subword_run):
    import tensorflow as tf

    model = _model(subword_run / "data/text_lm_subword")
    reader = subwords.Subwords(model)
    in_graph = subwords.graph_tokenizer(model).tokenize(tf.constant(HARD_TEXTS)).to_list()
    assert in_graph == [reader.encode(text) for text in HARD_TEXTS]
    assert [reader.decode(ids) for ids in in_graph] == HARD_TEXTS  # lossless: byte fallback

    from tftrain.engine.export import register_text_ops

    register_text_ops()
    (path,) = glob.glob(str(subword_run / "runs/text_lm_subword/export/*/"))
    serve = tf.saved_model.load(path).signatures["serving_text"]
    out = serve(text=tf.constant(HARD_TEXTS))
    for text, ids in zip(HARD_TEXTS, out["token_ids"].numpy()):
        expected = reader.encode(text)[-64:]  # the last window's worth, padded after
        assert ids.tolist() == expected + [0] * (64 - len(expected))
    assert out["logits"].shape == (len(HARD_TEXTS), 64, 1024)


def test_evaluate_and_generate_on_subwords(subword_run):
    summary = json.loads((subword_run / "runs/text_lm_subword/summary.json").read_text())
    manifest = json.loads((subword_run / "data/text_lm_subword/dataset.json").read_text())
    evaluated = summary["eval"]
    assert summary["task"]["type"] == "language_model" and evaluated["split"] == "test"
    # exp(mean cross-entropy), and well below a uniform guess over the 1024 ids (perplexity
    # 1024, where the untrained model starts): 281 measured after the 20 steps.
    assert evaluated["perplexity"] == pytest.approx(np.exp(evaluated["loss"]), rel=1e-4)
    assert 1 < evaluated["perplexity"] < manifest["info"]["vocab_size"] / 2, evaluated
    shown = tftrain(*documented.args("tftrain evaluate --model=runs/text_lm_subword/export "
                                     "--data=data/text_lm_subword --split=test"),
                    cwd=subword_run).stdout
    # The export evaluated alone: the perplexity the run measured on the same split.
    printed = float(re.search(r"perplexity=([\d.]+)", shown).group(1))
    assert printed == pytest.approx(evaluated["perplexity"], rel=1e-3), shown
    text = tftrain("generate", "--model_dir=runs/text_lm_subword", "--prompt=The naïve ",
                   "--max_tokens=30", "--temperature=0", cwd=subword_run).stdout
    assert text.startswith("The naïve ") and len(text) > len("The naïve ") + 10
    text = tftrain(*documented.args('tftrain generate --model_dir=runs/text_lm_subword '
                                    '--prompt="The " --max_tokens=40 --seed=1'),
                   cwd=subword_run).stdout
    assert text.startswith("The ") and len(text) > len("The ") + 10


def test_a_users_text_directory_keeps_its_splits_and_fits_on_training_text_only(tmp_path):
    source = tmp_path / "books"
    source.mkdir()
    prose = "".join(f"Chapter {i}. The river ran past the mill, and the miller sang.\n"
                    for i in range(600))
    (source / "train-a.txt").write_text(prose)
    (source / "train-b.txt").write_text(prose.replace("river", "road"))
    (source / "test.txt").write_text("Zyzzogeton ☃ " * 400 + "\n")
    for tokenizer in ("sentencepiece", "characters"):
        out = tmp_path / tokenizer
        tftrain("convert", "--pipeline=text", f"--input={source}", f"--output={out}",
                f"--pipeline_options=tokenizer={tokenizer},sequence_length=32,vocab_size=300",
                ONE_WORKER)
        manifest = json.loads((out / "dataset.json").read_text())
        assert set(manifest["splits"]) == {"train", "test"}
        if tokenizer == "sentencepiece":
            pieces = subwords.Subwords(_model(out)).processor
            assert not any("Zyzz" in pieces.id_to_piece(i) or "☃" in pieces.id_to_piece(i)
                           for i in range(pieces.get_piece_size()))
        else:
            assert "☃" not in manifest["info"]["vocabulary"]
        # two training documents: one end-of-document id between them, none in the one test text
        train_ids = load_all(out, "train")[0]
        test_ids = load_all(out, "test")[0]
        assert (train_ids == END_ID).sum() == 1 and not (test_ids == END_ID).any()
    # the subword dataset through the rest of the user's path: train, evaluate, generate (two
    # steps: the questions are that each command takes this run and its tokenizer, not how well
    # it predicts; the module's shipped-config run answers that)
    run = tmp_path / "run"
    tftrain("train", "--config=text_lm_subword", f"--model_dir={run}",
            f"--params_override=data.dir={tmp_path / 'sentencepiece'},data.eval_split=test,"
            "train.steps=2")
    assert "perplexity=" in tftrain("evaluate", f"--model={run / 'export'}",
                                    f"--data={tmp_path / 'sentencepiece'}", "--split=test").stdout
    text = tftrain("generate", f"--model_dir={run}", "--prompt=Chapter 7. The ",
                   "--max_tokens=12", "--seed=2").stdout
    assert text.startswith("Chapter 7. The ")


def test_jsonl_classification_on_subwords(tmp_path):
    data = tmp_path / "data"
    tftrain("convert", "--pipeline=jsonl", f"--output={data}",
            "--pipeline_options=tokenizer=sentencepiece,max_length=24", ONE_WORKER)
    manifest = json.loads((data / "dataset.json").read_text())
    assert set(manifest["features"]) == {"tokens", "label"}
    run = tmp_path / "run"
    # Two steps: the questions are what the export serves and what the records hold, not how
    # well it classifies (tests/test_text_classification.py trains the shipped config).
    tftrain("train", "--config=text_classification", f"--model_dir={run}",
            f"--params_override=data.dir={data},train.steps=2,train.validation_steps=1")
    import tensorflow as tf

    from tftrain.engine.export import register_text_ops

    register_text_ops()
    (path,) = glob.glob(str(run / "export/*/"))
    serve = tf.saved_model.load(path).signatures["serving_text"]
    out = serve(text=tf.constant(["LATIN SMALL LETTER A", "DIGIT SEVEN"]))
    assert set(out) >= {"classes", "probabilities"}
    reader = subwords.Subwords(_model(data))
    inputs, _ = load_all(data, "test")
    first = inputs[0][inputs[0] > 0].tolist()
    assert reader.encode(reader.decode(first))[:24] == first  # records hold the reader's ids


def test_append_keeps_the_model_byte_for_byte(tmp_path):
    (tmp_path / "a.txt").write_text("the first book, about rivers and mills.\n" * 300)
    (tmp_path / "b.txt").write_text("the second book, about roads and inns.\n" * 300)
    data = tmp_path / "data"
    options = "--pipeline_options=tokenizer=sentencepiece,sequence_length=32,vocab_size=300"
    tftrain("convert", "--pipeline=text", f"--input={tmp_path / 'a.txt'}", f"--output={data}",
            options, ONE_WORKER)
    before = _model(data)
    tftrain("convert", "--pipeline=text", f"--input={tmp_path / 'b.txt'}", f"--output={data}",
            options, "--append", ONE_WORKER)
    assert _model(data) == before
    manifest = json.loads((data / "dataset.json").read_text())
    assert [a["sha256"] for a in manifest["assets"]] == [hashlib.sha256(before).hexdigest()]
    assert len(manifest["appends"]) == 1


@pytest.mark.parametrize("options,message", [
    ("tokenizer=bpe", "tokenizer='bpe' is not one of characters, sentencepiece (pipeline text)"),
    ("tokenizer=sentencepiece,vocab_size=100", "vocab_size"),
])
def test_bad_options_are_one_line(tmp_path, options, message):
    done = tftrain("convert", "--pipeline=text", f"--output={tmp_path / 'd'}",
                   f"--pipeline_options={options}", check=False)
    assert done.returncode != 0 and message in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_an_altered_model_is_refused_in_one_line(tmp_path):
    data = tmp_path / "data"
    (tmp_path / "a.txt").write_text("some text to tokenize, and more of it.\n" * 300)
    tftrain("convert", "--pipeline=text", f"--input={tmp_path / 'a.txt'}", f"--output={data}",
            "--pipeline_options=tokenizer=sentencepiece,sequence_length=16,vocab_size=300",
            ONE_WORKER)
    with open(data / "tokenizer.model", "ab") as f:
        f.write(b"\0")
    done = tftrain("inspect", f"--data={data}", "--verify", check=False)
    assert done.returncode != 0 and "tokenizer.model" in done.stdout + done.stderr


def test_jsonl_rows_are_documents_packed_with_end_ids(tmp_path):
    from pipelines.text import Characters

    documents = [f"Document {i}: " + "words of a short note. " * (i % 5 + 1) for i in range(300)]
    rows = [json.dumps({"text": text}) for text in documents]
    rows.insert(7, json.dumps({"body": "no text key"}))
    (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n")
    data = tmp_path / "data"
    tftrain("convert", "--pipeline=text", f"--input={tmp_path / 'train.jsonl'}",
            f"--output={data}", "--pipeline_options=sequence_length=160", ONE_WORKER)
    manifest = json.loads((data / "dataset.json").read_text())
    assert manifest["bad_rows"]["count"] == 1 and len(manifest["splits"]) == 3  # 80/10/10
    windows = np.concatenate([np.concatenate([x, y[:, -1:]], axis=1) for x, y in (
        load_all(data, split) for split in manifest["splits"])])
    # each split: one end id between its consecutive documents (its dropped tail: at most one)
    assert 300 - 6 <= int((windows == END_ID).sum()) <= 300 - 3  # 300 documents
    characters, whole = Characters(manifest["info"]), set(documents)
    inner = 0
    for window in windows:
        passages = np.split(window, np.flatnonzero(window == END_ID))
        for passage in passages[1:-1]:  # between two end ids: a whole document
            assert characters.decode(passage) in whole
            inner += 1
    assert inner > 30

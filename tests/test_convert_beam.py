"""--runner=beam (DirectRunner): the same examples, splits and manifest as the local writer."""
from __future__ import annotations

import json

from tests import documented
from tests.test_convert import Pipeline, records
from tftrain.data import inspection, load
from tftrain.data import manifest as manifest_lib
from tftrain.data.beam_writer import write_dataset_beam
from tftrain.data.writer import write_dataset

BEAM = "--runner=DirectRunner --direct_num_workers=2 --direct_running_mode=multi_threading"


def test_beam_matches_the_local_writer(tmp_path):
    pipeline = Pipeline(n=300, bad_every=40)
    local = write_dataset(pipeline, "", str(tmp_path / "local"), workers=1, num_shards=3,
                          max_bad_fraction=0.05)
    beam = write_dataset_beam(pipeline, "", str(tmp_path / "beam"), beam_options=BEAM,
                              num_shards=3, max_bad_fraction=0.05)
    assert set(beam["splits"]) == set(local["splits"]) == {"train", "test"}
    for split in beam["splits"]:
        assert sorted(records(tmp_path / "beam", split)) == sorted(records(tmp_path / "local", split))
        assert beam["splits"][split]["num_examples"] == local["splits"][split]["num_examples"]
        assert beam["splits"][split]["label_counts"] == local["splits"][split]["label_counts"]
        assert [s["file"] for s in beam["splits"][split]["shards"]] == \
            [s["file"] for s in local["splits"][split]["shards"]]
    assert set(beam) == set(local)
    assert beam["features"] == local["features"] and beam["info"] == local["info"]
    assert beam["bad_rows"] == local["bad_rows"]
    bad = [json.loads(line) for line in (tmp_path / "beam" / "bad_rows.jsonl").read_text().splitlines()]
    assert sorted(b["key"] for b in bad) == sorted(
        json.loads(line)["key"] for line in (tmp_path / "local" / "bad_rows.jsonl").read_text().splitlines())
    assert not [p.name for p in (tmp_path / "beam").iterdir() if "tmp" in p.name]
    assert inspection.verify(str(tmp_path / "beam")) == []
    # The same reader accepts it.
    batches = list(load(str(tmp_path / "beam"), "test", 16, training=False,
                         pipeline="tests.test_convert").as_numpy_iterator())
    assert sum(len(b[1]) for b in batches) == beam["splits"]["test"]["num_examples"]


def serialized(data_dir: str, split: str) -> list[bytes]:
    """The records of a split, sorted."""
    import tensorflow as tf

    manifest = manifest_lib.read(data_dir)
    return sorted(record for path in manifest_lib.shard_files(data_dir, manifest, split)
                  for record in tf.data.TFRecordDataset(path).as_numpy_iterator())


def test_beam_cli_and_errors(tmp_path, cli, capsys, monkeypatch, digits_dir):
    """The reference's Beam command as written (in a fresh directory): the embedded digits,
    the same examples in each split as the local writer's, verified; then a failing job."""
    monkeypatch.chdir(tmp_path)
    assert cli(*documented.args(
        "tftrain convert --pipeline=digits --output=data/digits --runner=beam "
        "--beam_options='--runner=DirectRunner --direct_num_workers=2'")) == 0
    assert "with Beam" in capsys.readouterr().out
    beam = str(tmp_path / "data" / "digits")
    local = manifest_lib.read(digits_dir)["splits"]
    assert set(manifest_lib.read(beam)["splits"]) == set(local) == {"train", "validation", "test"}
    for split in local:
        assert serialized(beam, split) == serialized(digits_dir, split), split
    assert inspection.verify(beam) == []
    assert cli("convert", "--pipeline=tests.test_convert", "--pipeline_options=n=200,fail_at=150",
               f"--output={tmp_path / 'bad'}", "--runner=beam", "--overwrite") == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert errors[-1].startswith("tftrain convert: error: the Beam conversion job failed")
    assert "the pipeline has a bug" in errors[-1]
    assert not (tmp_path / "bad" / "dataset.json").exists()


def test_beam_writes_the_tokenizer_model_of_a_subword_dataset(tmp_path):
    """A pipeline's asset (text's SentencePiece model) is written and listed by Beam as by the
    local writer, and the windows are the same."""
    from pipelines import load_pipeline

    (tmp_path / "book.txt").write_text("".join(f"Page {i}: the tide rose over the sand.\n"
                                               for i in range(800)))
    options = dict(tokenizer="sentencepiece", vocab_size=300, sequence_length=32)
    source = str(tmp_path / "book.txt")
    local = write_dataset(load_pipeline("text", **options), source, str(tmp_path / "local"),
                          workers=1, num_shards=2)
    beam = write_dataset_beam(load_pipeline("text", **options), source, str(tmp_path / "beam"),
                              beam_options=BEAM, num_shards=2)
    assert beam["assets"] == local["assets"] and len(beam["assets"]) == 1
    assert (tmp_path / "beam" / "tokenizer.model").read_bytes() == (
        tmp_path / "local" / "tokenizer.model").read_bytes()
    import tensorflow as tf

    def windows(name, split):
        files = sorted(str(p) for p in (tmp_path / name).glob(f"{split}-*.tfrecord"))
        return sorted(tf.data.TFRecordDataset(files).as_numpy_iterator())

    assert set(beam["splits"]) == set(local["splits"]) and windows("local", "train")
    for split in local["splits"]:
        assert windows("beam", split) == windows("local", split)
    assert inspection.verify(str(tmp_path / "beam")) == []

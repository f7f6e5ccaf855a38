"""tftrain never deletes or overwrites what it did not write (dataset dirs, run dirs, their
export/, pruned/ and quantized/), and one tftrain command at a time writes into a run dir."""
from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import time

import pytest
import tf_keras as keras
import yaml

from tests import forked_cli
from tests.conftest import PYTHON, REPO
from tests.test_convert import Pipeline, output_names
from tftrain import config as config_lib
from tftrain import dir_lock, ownership, run_dir
from tftrain.engine import train
from tftrain.data import inspection, shard_plan, writer
from tftrain.data import manifest as manifest_lib
from tftrain.data.writer import write_dataset
from tftrain.errors import TftrainError
from pipelines.base import Row

FOREIGN_SHARDS = [f"train-{i:05d}-of-00008.tfrecord" for i in range(8)]


def tiny_run_flags(digits_dir, epochs=1):
    return ("--params_override=" + f"data.dir={digits_dir},train.epochs={epochs},"
            "train.steps_per_epoch=2,model.name=mlp,model.params={hidden_units: [8]},"
            "data.batch_size=16")


def snapshot(path):
    """{relative path: bytes} of every file under `path`."""
    files = {}
    for directory, _, names in os.walk(path):
        for name in names:
            full = os.path.join(directory, name)
            with open(full, "rb") as f:
                files[os.path.relpath(full, path)] = f.read()
    return files


@pytest.fixture
def foreign_shards(tmp_path):
    """A directory of eight shards written by other TF tooling (no dataset.json)."""
    out = tmp_path / "shards"
    out.mkdir()
    for i, name in enumerate(FOREIGN_SHARDS):
        (out / name).write_bytes(b"someone else's records %d" % i)
    return out


@pytest.fixture
def table_csv(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b,label\n" + "".join(f"{i},{i % 7},{i % 2}\n" for i in range(40)))
    return path


def one_error_line(err):
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1, err
    return lines[0]


# ---- dataset directories -------------------------------------------------------------------

def test_convert_refuses_a_directory_of_foreign_shards_and_touches_nothing(
        foreign_shards, table_csv, cli, capsys):
    before = snapshot(foreign_shards)
    assert cli("convert", "--pipeline=csv", f"--input={table_csv}",
               f"--output={foreign_shards}") == 1
    line = one_error_line(capsys.readouterr().err)
    assert ("holds train-00000-of-00008.tfrecord, train-00001-of-00008.tfrecord, "
            "train-00002-of-00008.tfrecord and 5 more (8 entries) that tftrain did not "
            "write") in line
    assert "new or empty --output" in line and "--overwrite" in line
    assert snapshot(foreign_shards) == before  # not even a lock file


def test_overwrite_writes_beside_foreign_files_and_keeps_them(foreign_shards, table_csv, cli):
    before = snapshot(foreign_shards)
    for num_shards in ("2", "1"):  # the second replaces tftrain's own 2-shard dataset
        assert cli("convert", "--pipeline=csv", f"--input={table_csv}", "--overwrite",
                   f"--output={foreign_shards}", f"--num_shards={num_shards}", "--workers=1") == 0
        after = snapshot(foreign_shards)
        assert {name: after[name] for name in before} == before
    manifest = manifest_lib.read(str(foreign_shards))
    own = sorted(s["file"] for split in manifest["splits"].values() for s in split["shards"])
    assert own == ["test-00000-of-00001.tfrecord", "train-00000-of-00001.tfrecord",
                   "validation-00000-of-00001.tfrecord"]
    assert output_names(foreign_shards) == sorted(FOREIGN_SHARDS + own + ["dataset.json"])
    assert ownership.CONVERT_MARKER not in os.listdir(foreign_shards)  # gone once complete
    assert inspection.verify(str(foreign_shards)) == []


def test_overwrite_never_writes_over_a_foreign_file_of_the_same_name(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "train-00000-of-00001.tfrecord").write_bytes(b"not ours")
    (out / "dataset.json").write_text('{"written by": "another tool"}')
    with pytest.raises(TftrainError, match="holds dataset.json, train-00000-of-00001.tfrecord "
                                           r"\(2 entries\) that tftrain did not write"):
        write_dataset(Pipeline(n=50), "", str(out), num_shards=1, workers=1)
    with pytest.raises(TftrainError, match=rf"{out}/dataset.json was not written by tftrain, and "
                                           "this conversion writes its manifest under that name "
                                           r"\(and 1 more: train-00000-of-00001.tfrecord\)"):
        write_dataset(Pipeline(n=50), "", str(out), num_shards=1, workers=1, overwrite=True)
    (out / "dataset.json").unlink()
    with pytest.raises(TftrainError, match=rf"{out}/train-00000-of-00001.tfrecord was not "
                                           "written by tftrain, and this conversion writes a "
                                           "shard"):
        write_dataset(Pipeline(n=50), "", str(out), num_shards=1, workers=1, overwrite=True)
    assert (out / "train-00000-of-00001.tfrecord").read_bytes() == b"not ours"
    assert not [n for n in output_names(out) if n != "train-00000-of-00001.tfrecord"]


def interrupt_after_publishing(monkeypatch):
    """Makes the next conversion stop like a kill -9 once its shards are published: no manifest,
    no clean-up (what a killed process leaves)."""
    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(writer, "finish", killed)
    monkeypatch.setattr(writer, "remove_shards", lambda plan: None)


def test_the_rerun_clears_an_interrupted_conversion_and_keeps_foreign_files(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with monkeypatch.context() as patch:
        interrupt_after_publishing(patch)
        with pytest.raises(KeyboardInterrupt):
            write_dataset(Pipeline(n=80), "", str(out), num_shards=3, workers=1, overwrite=True)
    left = set(os.listdir(out))
    assert ownership.CONVERT_MARKER in left and "train-00002-of-00003.tfrecord" in left
    assert not manifest_lib.exists(str(out))
    # Foreign files stay foreign: the rerun needs --overwrite again, like the first run.
    with pytest.raises(TftrainError, match=r"holds notes.txt \(1 entry\) that tftrain did not"):
        write_dataset(Pipeline(n=80), "", str(out), num_shards=2, workers=1)
    manifest = write_dataset(Pipeline(n=80), "", str(out), num_shards=2, workers=1, overwrite=True)
    assert sum(s["num_examples"] for s in manifest["splits"].values()) == 80
    assert output_names(out) == ["dataset.json", "notes.txt", "test-00000-of-00002.tfrecord",
                                 "test-00001-of-00002.tfrecord", "train-00000-of-00002.tfrecord",
                                 "train-00001-of-00002.tfrecord"]
    assert (out / "notes.txt").read_text() == "mine"
    assert ownership.CONVERT_MARKER not in os.listdir(out)


class LateSplitPipeline(Pipeline):
    """Rows with source splits; the `test` rows come last, after the sample has stopped."""

    def read(self, source, info, worker=0, num_workers=1):
        for i in range(worker, self.n, num_workers):
            yield Row(key=f"row/{i:05d}", value=i, split="train" if i < self.n - 20 else "test")


def test_shards_of_a_split_the_plan_did_not_foresee_are_claimed(tmp_path, monkeypatch):
    monkeypatch.setattr(shard_plan, "SAMPLE_ROWS", 10)
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        interrupt_after_publishing(patch)
        with pytest.raises(KeyboardInterrupt):
            write_dataset(LateSplitPipeline(n=60), "", str(out), workers=1)
    left = os.listdir(out)
    assert "test-00000-of-00001.tfrecord" in left  # not listed by the marker ...
    assert [n for n in left if n.startswith(".test-00000-of-00001.tfrecord.claim.tmp-")]  # claimed
    manifest = write_dataset(LateSplitPipeline(n=60), "", str(out), workers=1)
    assert manifest["splits"]["test"]["num_examples"] == 20
    assert output_names(out) == ["dataset.json", "test-00000-of-00001.tfrecord",
                                 "train-00000-of-00001.tfrecord"]


def test_the_beam_writer_follows_the_same_rules(foreign_shards):
    pytest.importorskip("apache_beam")
    from tftrain.data.beam_writer import write_dataset_beam

    before = snapshot(foreign_shards)
    with pytest.raises(TftrainError, match=r"and 5 more \(8 entries\) that tftrain did not write"):
        write_dataset_beam(Pipeline(n=50), "", str(foreign_shards), num_shards=1)
    (foreign_shards / "train-00000-of-00001.tfrecord").write_bytes(b"not ours")
    with pytest.raises(TftrainError, match="train-00000-of-00001.tfrecord was not written by"):
        write_dataset_beam(Pipeline(n=50), "", str(foreign_shards), num_shards=1, overwrite=True)
    assert {name: snapshot(foreign_shards)[name] for name in before} == before


# ---- run directories -----------------------------------------------------------------------

def test_train_refuses_a_directory_it_did_not_write(tmp_path, digits_dir, cli, capsys):
    model_dir = tmp_path / "mine"
    model_dir.mkdir()
    (model_dir / "notes.txt").write_text("my notes")
    (model_dir / "data.csv").write_text("a,b\n1,2\n")
    assert cli("train", f"--model_dir={model_dir}", tiny_run_flags(digits_dir)) == 1
    line = one_error_line(capsys.readouterr().err)
    assert (f"{model_dir} is not a tftrain run directory: it holds data.csv, notes.txt "
            "(2 entries) that tftrain did not write") in line
    assert "--overwrite" in line
    assert sorted(os.listdir(model_dir)) == ["data.csv", "notes.txt"]  # not even a lock file


def test_overwrite_trains_beside_foreign_files_and_never_over_them(tmp_path, digits_dir, cli,
                                                                    capsys):
    model_dir = tmp_path / "mine"
    (model_dir / "export").mkdir(parents=True)
    (model_dir / "export/saved_model.pb").write_bytes(b"my own model")
    (model_dir / "notes.txt").write_text("my notes")
    assert cli("train", f"--model_dir={model_dir}", "--overwrite", tiny_run_flags(digits_dir)) == 1
    line = one_error_line(capsys.readouterr().err)
    assert (f"{model_dir}/export was not written by tftrain, and training writes its "
            "SavedModel") in line
    assert sorted(os.listdir(model_dir)) == ["export", "notes.txt"]
    assert (model_dir / "export/saved_model.pb").read_bytes() == b"my own model"

    (model_dir / "export").rename(tmp_path / "moved")
    assert cli("train", f"--model_dir={model_dir}", "--overwrite", tiny_run_flags(digits_dir)) == 0
    assert ownership.marked(str(model_dir), run_dir.KIND)
    assert ownership.marked(str(model_dir / "export"), "export")
    # Retraining the finished run removes tftrain's entries only: a pruned/ without tftrain's
    # marker is someone else's.
    (model_dir / "pruned").mkdir()
    (model_dir / "pruned/mine.txt").write_text("mine")
    assert cli("train", f"--model_dir={model_dir}", "--overwrite", tiny_run_flags(digits_dir)) == 0
    assert (model_dir / "notes.txt").read_text() == "my notes"
    assert (model_dir / "pruned/mine.txt").read_text() == "mine"
    assert json.loads((model_dir / "summary.json").read_text())["epochs"] == 1


def legacy_run(path, finished=True):
    """A run directory as an earlier tftrain left it: no markers."""
    path.mkdir()
    (path / "params.yaml").write_text(config_lib.to_yaml(config_lib.Config()))
    (path / "logs").mkdir()
    (path / "export").mkdir()
    (path / "export/saved_model.pb").write_bytes(b"tftrain's")
    if finished:
        (path / "summary.json").write_text("{}")
        (path / "pruned").mkdir()
        (path / "pruned/report.json").write_text("{}")
        (path / "quantized").mkdir()
        (path / "quantized/notes.txt").write_text("no report: not tftrain's")
    else:
        (path / "backup").mkdir()
    (path / "notes.txt").write_text("my notes")
    return path


def test_run_dirs_of_earlier_versions_still_resume_and_overwrite(tmp_path):
    unfinished = legacy_run(tmp_path / "unfinished", finished=False)
    run_dir.prepare(str(unfinished), overwrite=False)
    assert ownership.marked(str(unfinished), run_dir.KIND)
    assert run_dir.replaceable(str(unfinished / "export"))  # adopted: marked as tftrain's
    assert ownership.marked(str(unfinished / "export"), "export")
    run_dir.finish(str(unfinished), {"epochs": 1})

    finished = legacy_run(tmp_path / "finished")
    assert run_dir.replaceable(str(finished / "pruned"))  # its report.json proves it
    assert not run_dir.replaceable(str(finished / "quantized"))
    with pytest.raises(TftrainError, match="holds a finished run"):
        run_dir.prepare(str(finished), overwrite=False)
    run_dir.prepare(str(finished), overwrite=True)
    assert sorted(os.listdir(finished)) == [".tftrain-run.lock", ".tftrain.json", "notes.txt",
                                           "quantized"]
    run_dir.finish(str(finished), {"epochs": 1})

    # A params.yaml of another tool (Model Garden's has a `trainer` section) proves nothing.
    other = tmp_path / "model_garden"
    other.mkdir()
    (other / "params.yaml").write_text(yaml.safe_dump({"task": {}, "trainer": {}}))
    with pytest.raises(TftrainError, match=r"not a tftrain run directory: it holds params.yaml"):
        run_dir.prepare(str(other), overwrite=False)
    with pytest.raises(TftrainError, match="params.yaml was not written by tftrain, and training "
                                           "writes its resolved config there"):
        run_dir.prepare(str(other), overwrite=True)


def test_export_replaces_only_what_tftrain_wrote(tmp_path):
    model = keras.Sequential([keras.layers.Dense(2, input_shape=(3,))])
    mine = tmp_path / "export"
    train.export(model, str(mine))
    assert ownership.MARKER in os.listdir(mine)
    train.export(model, str(mine))  # its own: replaced
    foreign = tmp_path / "theirs"
    foreign.mkdir()
    (foreign / "saved_model.pb").write_bytes(b"theirs")
    with pytest.raises(TftrainError, match=rf"{foreign} was not written by tftrain"):
        train.export(model, str(foreign))
    assert os.listdir(foreign) == ["saved_model.pb"]


def hold_run_lock(model_dir):
    """Another process holding `model_dir`'s run lock, as a running `tftrain train` does."""
    code = ("import sys, time; from tftrain import dir_lock; "
            "dir_lock.acquire(sys.argv[1], dir_lock.RUN_LOCK, 'tftrain train'); "
            "print('locked', flush=True); time.sleep(120)")
    holder = subprocess.Popen([PYTHON, "-c", code, str(model_dir)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def stop(process):
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def test_only_the_chief_takes_the_run_lock(tmp_path):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    holder = hold_run_lock(model_dir)
    try:
        run_dir.prepare(str(model_dir), overwrite=False, chief=False)  # a worker: not refused
        with pytest.raises(TftrainError, match=rf"another tftrain train \(pid {holder.pid} on "
                                               rf"{socket.gethostname()}\) is writing into "
                                               f"{model_dir}; wait for it"):
            run_dir.prepare(str(model_dir), overwrite=False, chief=True)
    finally:
        stop(holder)
    run_dir.prepare(str(model_dir), overwrite=False)  # the kernel released it with the process
    run_dir.finish(str(model_dir), {"epochs": 0})


def test_a_second_train_into_the_same_model_dir_stops_at_once(tmp_path, digits_dir, cli, capsys,
                                                                 monkeypatch):
    model_dir = tmp_path / "run"
    log = open(tmp_path / "first.log", "w")
    first = forked_cli.Popen(["train", f"--model_dir={model_dir}",
                              tiny_run_flags(digits_dir, epochs=1000)],
                             stdout=log, stderr=forked_cli.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not (model_dir / "params.yaml").exists():
            assert first.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "first.log").read_text()[-2000:]
            time.sleep(0.05)
        # Every flock the second run makes on the run lock: one attempt that cannot wait.
        attempts, real_flock = [], fcntl.flock

        def flock(fd, operation):
            path = os.readlink(f"/proc/self/fd/{fd if isinstance(fd, int) else fd.fileno()}")
            if path == os.path.join(os.path.realpath(model_dir), dir_lock.RUN_LOCK):
                attempts.append(operation)
            return real_flock(fd, operation)

        with monkeypatch.context() as patch:
            patch.setattr(fcntl, "flock", flock)
            assert cli("train", f"--model_dir={model_dir}", tiny_run_flags(digits_dir)) == 1
        assert attempts == [fcntl.LOCK_EX | fcntl.LOCK_NB]
        line = one_error_line(capsys.readouterr().err)
        assert (f"another tftrain train (pid {first.pid} on {socket.gethostname()}) is writing "
                f"into {model_dir}") in line
        assert first.poll() is None  # the first run goes on: the second did not wait for it
    finally:
        stop(first)
        log.close()


def test_a_directory_killed_while_its_marker_was_written_is_tftrains(tmp_path):
    from tftrain import ownership, run_dir

    export = tmp_path / "export"
    export.mkdir()
    (export / f"{ownership.MARKER}.tmp-12345").write_text("{")  # the rename never happened
    assert run_dir.replaceable(str(export))
    (export / "notes.txt").write_text("mine")  # anything else still makes it someone else's
    assert not run_dir.replaceable(str(export))


def test_a_run_that_wrote_nothing_leaves_no_directory_but_anything_else_stays(tmp_path):
    claimed = tmp_path / "claimed"
    run_dir.prepare(str(claimed), overwrite=False)
    (claimed / run_dir.PARAMS).write_text("data: {}\n")
    run_dir.release(str(claimed))
    assert set(os.listdir(claimed)) == run_dir.CLAIM
    assert run_dir.discard_unused(str(claimed)) and not claimed.exists()
    for extra in ("logs", "notes.txt"):  # its own output, or a file of the user's: kept
        kept = tmp_path / extra
        run_dir.prepare(str(kept), overwrite=False)
        run_dir.release(str(kept))
        (kept / extra).mkdir() if extra == "logs" else (kept / extra).write_text("mine")
        assert not run_dir.discard_unused(str(kept))
        assert {ownership.MARKER, extra} <= set(os.listdir(kept))
    empty = tmp_path / "empty"  # nothing to tell whose: kept
    empty.mkdir()
    assert not run_dir.discard_unused(str(empty)) and empty.exists()

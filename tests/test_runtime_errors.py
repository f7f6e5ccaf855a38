"""Errors while a command runs end in one line (what, where, what to do) and a non-zero exit,
never a traceback (#41): content that TensorFlow cannot take in files that are intact (valid
checksums, a manifest whose sizes and sha256 match), and what the machine refuses."""
from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from tests.test_damaged_datasets import digits_copy  # noqa: F401  (a fixture)

LABEL = "image/class/label"


def rewritten(dataset, split: str, index: int, change) -> None:
    """Record `index` of `split`'s first shard replaced by `change(record bytes)`, written with
    valid checksums, and the manifest's size and sha256 of that shard updated: damage that
    framing checks cannot see."""
    import tensorflow as tf

    manifest_path = dataset / "dataset.json"
    manifest = json.loads(manifest_path.read_text())
    shard = manifest["splits"][split]["shards"][0]
    path = dataset / shard["file"]
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(path))]
    records[index] = change(records[index])
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    data = path.read_bytes()
    shard["bytes"], shard["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    manifest_path.write_text(json.dumps(manifest))


def with_label(value: int):
    def change(record: bytes) -> bytes:
        import tensorflow as tf

        example = tf.train.Example.FromString(record)
        example.features.feature[LABEL].int64_list.value[:] = [value]
        return example.SerializeToString()
    return change


def with_image_cut_to(end: int):
    """A record change: its raw image keeps the bytes before `end` (a Python slice's end)."""
    def change(record: bytes) -> bytes:
        import tensorflow as tf

        example = tf.train.Example.FromString(record)
        pixels = example.features.feature["image/encoded"].bytes_list.value
        pixels[0] = pixels[0][:end]
        return example.SerializeToString()
    return change


def train_error(cli, capsys, data, model_dir) -> tuple[int, list[str]]:
    code = cli("train", f"--model_dir={model_dir}", f"--params_override=data.dir={data},"
               "train.epochs=1,train.steps_per_epoch=50")
    return code, capsys.readouterr().err.strip().splitlines()


def past_the_vocabulary(record: bytes) -> bytes:
    """A text record whose sixth token id is 5000 (the embedded text's vocabulary has 105)."""
    import tensorflow as tf

    example = tf.train.Example.FromString(record)
    example.features.feature["tokens"].int64_list.value[5] = 5000
    return example.SerializeToString()


@pytest.mark.parametrize("label", [999, -1])
def test_a_label_outside_the_classes_is_one_line(label, digits_copy, tmp_path, cli, capsys):
    rewritten(digits_copy, "train", 3, with_label(label))
    code, err = train_error(cli, capsys, digits_copy, tmp_path / "run")
    assert code == 1
    assert err == [f"tftrain train: error: a label of {label} in split 'train' of {digits_copy} "
                   "is outside the "
                   "model's 10 classes [0, 10): `tftrain inspect "
                   f"--data={digits_copy} --verify` lists the records that hold it; fix or drop "
                   "them and convert again (labels are class indices from 0)"], err


def test_bytes_that_are_not_an_example_are_one_line(digits_copy, tmp_path, cli, capsys):
    rewritten(digits_copy, "train", 3, lambda record: b"\xff\xfe not an Example \x00" * 3)
    code, err = train_error(cli, capsys, digits_copy, tmp_path / "run")
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"tftrain train: error: a record in {digits_copy} is not a "
                             "tf.train.Example of the dataset's schema"), err


def test_a_model_dir_name_too_long_is_one_line(digits_dir, tmp_path, cli, capsys):
    code, err = train_error(cli, capsys, digits_dir, tmp_path / ("r" * 300))
    assert code == 1
    assert len(err) == 1 and err[0].startswith(
        "tftrain train: error: a path is too long for the file system"), err
    assert "choose a shorter --model_dir" in err[0]


def test_the_other_errors_are_named_by_kind():
    """Memory and lost peers, from the errors TensorFlow raises (the messages as TF 2.21 words
    them); the real cases, caused in processes of their own, are tested below."""
    import tensorflow as tf

    from tftrain.cli import system_error_message

    oom = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")
    assert system_error_message("train", oom).startswith("out of memory while `tftrain train` ran")
    lost = tf.errors.UnavailableError(None, None, "The following tasks are unhealthy (stopped "
                                      "sending heartbeats):\n/job:worker/replica:0/task:1")
    line = system_error_message("train", lost)
    assert line.startswith("worker 1 stopped answering") and "run the same command" in line
    # worker 0's own collective, named before the list, is not the lost peer
    own = tf.errors.UnavailableError(None, None, "Collective ops on /job:worker/replica:0/task:0"
                                     " aborted: The following tasks are unhealthy (stopped "
                                     "sending heartbeats):\n/job:worker/replica:0/task:1")
    assert system_error_message("train", own).startswith("worker 1 stopped answering")
    assert system_error_message("train", ValueError("File name")) is None


def test_a_collective_past_its_deadline_is_a_lost_peer(monkeypatch):
    """A worker cut off from the others (tests/test_partition.py) gets DeadlineExceeded from
    its collective, which names its own device: the same lost-peer line, the peer unnamed."""
    import tensorflow as tf

    from tftrain.cli import system_error_message
    from tftrain.runtime import cluster

    monkeypatch.setenv(cluster.TF_CONFIG, cluster.make_tf_config(["a:1", "b:1"], 1))
    cut_off = tf.errors.DeadlineExceededError(None, None, (
        "{{function_node __wrapped__CollectiveReduceV2_Nordering_token_1_device_/job:worker/"
        "replica:0/task:1/device:CPU:0}} Collective ops is aborted by: Deadline Exceeded\nRPC: "
        "/tensorflow.CoordinationService/Heartbeat\nThe error could be from a previous "
        "operation. Restart your program to reset. [Op:CollectiveReduceV2]"))
    line = system_error_message("train", cut_off)
    assert line.startswith("a peer worker stopped answering (lost or unhealthy, or the network "
                           "between the workers cut"), line
    assert "run the same command on every worker again" in line
    # as worker 0, the task the collective names is the peer
    monkeypatch.setenv(cluster.TF_CONFIG, cluster.make_tf_config(["a:1", "b:1"], 0))
    assert system_error_message("train", cut_off).startswith("worker 1 stopped answering")
    graph = tf.errors.DeadlineExceededError(None, None, (
        "Graph execution error:\n\nDetected at node div_no_nan/CollectiveReduceV2_1 defined at "
        "(most recent call last): ... Deadline Exceeded"))
    assert system_error_message("train", graph).startswith("a peer worker stopped answering")
    # another deadline, with no collective or coordination in it, is not a lost peer
    assert system_error_message("train", tf.errors.DeadlineExceededError(
        None, None, "Timed out reading gs://bucket/x")) is None
    assert system_error_message("evaluate", cut_off) is None


def test_inspect_verify_on_bytes_that_are_not_an_example_is_one_line(digits_copy, cli, capsys):
    rewritten(digits_copy, "train", 3, lambda record: b"\xff\xfe not an Example \x00" * 3)
    assert cli("inspect", f"--data={digits_copy}", "--verify") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and (f"{first_shard(digits_copy, 'train')}, record 3: does not parse "
                              "against the schema: not a tf.train.Example") in err[0], err


def test_a_label_stored_as_a_float_is_one_line(digits_copy, tmp_path, cli, capsys):
    def as_float(record: bytes) -> bytes:
        import tensorflow as tf

        example = tf.train.Example.FromString(record)
        example.features.feature[LABEL].ClearField("int64_list")
        example.features.feature[LABEL].float_list.value[:] = [3.0]
        return example.SerializeToString()

    rewritten(digits_copy, "train", 3, as_float)
    code, err = train_error(cli, capsys, digits_copy, tmp_path / "run")
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"tftrain train: error: a record in {digits_copy} is not a "
                             "tf.train.Example of the dataset's schema (its feature "
                             f"{LABEL} has another type or shape): `tftrain inspect"), err


def test_a_token_id_past_the_vocabulary_is_one_line(text_dir, tmp_path, cli, capsys):
    """In the validation split: the first epoch's validation reads every batch of it."""
    data = tmp_path / "text"
    shutil.copytree(text_dir, data)
    rewritten(data, "validation", 3, past_the_vocabulary)
    code = cli("train", "--config=text_lm", f"--model_dir={tmp_path / 'run'}",
               f"--params_override=data.dir={data},train.epochs=1,train.steps_per_epoch=1,"
               "model.params={width: 16, num_layers: 1, num_heads: 2, mlp_width: 32}")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err == [f"tftrain train: error: an input id of 5000 in {data} is outside the model's "
                   "range [0, 105) (a token id past the vocabulary, or a category past its "
                   f"count): `tftrain inspect --data={data} --verify` lists the records that "
                   "hold it; convert the data with the tokenizer the model was built for"], err


# --- inspect --verify checks content, not only frames ----------------------------------------

def first_shard(dataset, split: str) -> str:
    return json.loads((dataset / "dataset.json").read_text())["splits"][split]["shards"][0]["file"]


def verify_error(cli, capsys, dataset) -> str:
    assert cli("inspect", f"--data={dataset}", "--verify") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"tftrain inspect: error: dataset {dataset} is "
                                               "damaged: "), err
    return err[0]


@pytest.mark.parametrize("label", [999, -1])
def test_verify_names_the_record_of_a_label_outside_the_classes(label, digits_copy, cli, capsys):
    rewritten(digits_copy, "train", 3, with_label(label))
    assert (f"{first_shard(digits_copy, 'train')}, record 3: label {LABEL}={label} is outside "
            "the 10 classes [0, 10)") in verify_error(cli, capsys, digits_copy)


def test_verify_compares_the_records_labels_with_the_manifests_counts(digits_copy, cli, capsys):
    import tensorflow as tf

    shard = digits_copy / first_shard(digits_copy, "train")
    record = next(iter(tf.data.TFRecordDataset(str(shard)).skip(3))).numpy()
    old = tf.train.Example.FromString(record).features.feature[LABEL].int64_list.value[0]
    new = (old + 1) % 10
    rewritten(digits_copy, "train", 3, with_label(new))  # a valid class, another count
    counts = json.loads((digits_copy / "dataset.json").read_text())["splits"]["train"][
        "label_counts"]
    first = min(old, new)
    now = counts[str(first)] + (1 if first == new else -1)
    assert (f"split train: label {first}: {now:,} records, the manifest's label_counts say "
            f"{counts[str(first)]:,}") in verify_error(cli, capsys, digits_copy)


def test_verify_names_the_record_of_a_token_id_past_the_vocabulary(text_dir, tmp_path, cli,
                                                                   capsys):
    data = tmp_path / "text"
    shutil.copytree(text_dir, data)
    rewritten(data, "validation", 3, past_the_vocabulary)
    assert (f"{first_shard(data, 'validation')}, record 3: token id 5000 in tokens is outside "
            "the vocabulary [0, 105)") in verify_error(cli, capsys, data)


@pytest.mark.parametrize("cut", [10, -1])
def test_verify_names_the_record_of_an_image_of_another_size(cut, digits_copy, cli, capsys):
    """The record parses (its image is one string, as the schema says) but holds 10 or 63 of
    the 64 pixels' bytes: it does not decode as training decodes it."""
    rewritten(digits_copy, "validation", 5, with_image_cut_to(cut))
    line = verify_error(cli, capsys, digits_copy)
    assert (f"{first_shard(digits_copy, 'validation')}, record 5: does not decode as the "
            "dataset's pipeline decodes it: ") in line, line


def test_a_frozen_peer_worker_ends_the_chief_in_one_line(tmp_path, digits_dir):
    """Two `train --worker_hosts` processes on loopback; once both train, worker 1 is frozen
    (SIGSTOP: alive, but it answers nothing, as a hung machine). Worker 0's collective waits
    for it until TensorFlow's coordination service notices the missing heartbeats; worker 0
    then exits 1 with one error line that names worker 1 and says how to resume, no traceback."""
    import os
    import re
    import signal

    from tests.launch_testutil import Running, group_gone
    from tftrain.runtime.launch import free_ports

    hosts = ",".join(f"127.0.0.1:{port}" for port in free_ports(2))
    args = ["train", f"--worker_hosts={hosts}", f"--model_dir={tmp_path / 'run'}",
            f"--params_override=data.dir={digits_dir},model.name=mlp,"
            "model.params={hidden_units: [16]},train.epochs=1000,train.steps_per_epoch=5"]
    workers = [Running(args + [f"--task_index={i}"], cwd=tmp_path, env={"TMPDIR": str(tmp_path)})
               for i in range(2)]
    try:
        for worker in workers:
            worker.wait_for_line(r"^Epoch 2/", 300)  # both past the first epoch's collectives
        os.killpg(workers[1].process.pid, signal.SIGSTOP)
        code = workers[0].wait(300)
    finally:
        for worker in workers:
            if worker.process.poll() is None:
                os.killpg(worker.process.pid, signal.SIGKILL)
                worker.process.wait(30)
    errors = [line for line in workers[0].lines if ": error: " in line]
    assert code == 1 and "Traceback" not in workers[0].output, workers[0].tail()
    assert len(errors) == 1 and re.match(
        r"tftrain train: error: worker 1 stopped answering \(lost or unhealthy", errors[0]), errors
    assert "run the same command on every worker again" in errors[0]
    assert all(group_gone(w.process.pid) for w in workers)


def train_with_memory_limit(argv: list[str]) -> None:
    """A forked command's entry point: `tftrain <argv>` with its address space limited to what
    the process maps now plus 3 GiB (RLIMIT_AS): an allocation past it fails as on a machine
    out of memory, where the kernel's OOM killer would not let the command say anything."""
    import resource

    from tftrain.cli import run

    with open("/proc/self/status") as f:
        mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (mapped + 3 * 2**30, resource.RLIM_INFINITY))
    run(argv)


def test_out_of_memory_ends_in_one_line_that_points_to_check(tmp_path, digits_dir):
    """A real allocation failure: an MLP whose first hidden layer alone needs 3.4 GiB, trained
    by a process that may map only 3 GiB more than it has."""
    from tests import forked_cli
    from tests.conftest import REPO

    out = forked_cli.run(
        ["train", f"--model_dir={tmp_path / 'run'}",
         f"--params_override=data.dir={digits_dir},model.name=mlp,"
         "model.params={hidden_units: [30000, 30000]},train.epochs=1,train.steps_per_epoch=2"],
        cwd=REPO, timeout=300, entry="tests.test_runtime_errors:train_with_memory_limit")
    errors = [line for line in out.stderr.splitlines() if ": error: " in line]
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert errors == ["tftrain train: error: out of memory while `tftrain train` ran "
                      "(ResourceExhaustedError): `tftrain check --config=... --target=...` plans "
                      "the memory a run needs and suggests a change that fits (a smaller "
                      "data.batch_size, train.grad_accum_steps, model.params.remat, "
                      "runtime.mixed_precision)"], errors


@pytest.mark.parametrize("model_dir,line", [
    ("/sys/tftrain-test-run", "permission denied: /sys/tftrain-test-run. Write somewhere you "
     "may write (--model_dir, --output), or fix the directory's permissions"),
    ("/proc/tftrain-test-run", "not found: /proc/tftrain-test-run (no such file or directory, or "
     "a place where none can be made): check the paths `tftrain train` was given (--model_dir, "
     "data.dir, --output, --model) and that nothing removed them while it ran"),
])
def test_a_run_directory_that_cannot_be_made_is_one_line(model_dir, line, digits_dir, cli,
                                                         capsys):
    """Places even root cannot write (the suite runs as root, which ignores permission bits):
    sysfs refuses a new directory (EPERM), procfs has none to give (ENOENT)."""
    code = cli("train", f"--model_dir={model_dir}", f"--params_override=data.dir={digits_dir}")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err == [f"tftrain train: error: {line}"], err


def test_an_image_of_another_size_is_one_line(digits_copy, tmp_path, cli, capsys):
    """A record whose image holds 10 of its 64 pixels' bytes: training stops at its batch."""
    rewritten(digits_copy, "train", 3, with_image_cut_to(10))
    code, err = train_error(cli, capsys, digits_copy, tmp_path / "run")
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"tftrain train: error: a record in {digits_copy} does not match "
                             "its manifest: an image_encoding=raw image of 10 bytes where "
                             "image_size 8x8x1 needs 64. "), err


def test_verify_names_the_record_of_a_regression_target_that_is_not_finite(tmp_path, cli,
                                                                           capsys):
    """A CSV with a real-valued label, converted; one record's target rewritten as NaN (a float
    still, framed validly, the manifest's size and sha256 matching)."""
    import tensorflow as tf

    source = tmp_path / "houses.csv"
    source.write_text("rooms,area,price\n" + "".join(
        f"{i % 5 + 1},{40 + i},{100 + 3.5 * i}\n" for i in range(40)))
    data = tmp_path / "houses"
    assert cli("convert", "--pipeline=csv", f"--input={source}", f"--output={data}",
               "--pipeline_options=label_column=price") == 0
    manifest = json.loads((data / "dataset.json").read_text())
    key = manifest["info"]["label"]["name"]
    assert manifest["features"][key]["dtype"] == "float32" and key == "price"

    def not_finite(record: bytes) -> bytes:
        example = tf.train.Example.FromString(record)
        example.features.feature[key].float_list.value[:] = [float("nan")]
        return example.SerializeToString()

    rewritten(data, "train", 2, not_finite)
    capsys.readouterr()
    assert (f"{first_shard(data, 'train')}, record 2: label {key} is nan, not a finite "
            "number") in verify_error(cli, capsys, data)

"""Exact resume: an interrupted and resumed run trains on exactly the batches, step for step, of
the run that was not interrupted; with `train.deterministic` it also ends with its weights.

The data are a NumPy array converted by the real `numpy` pipeline into 3 shards, whose first
feature is the example's id. The model (`recording_model`, loaded by the run as
`model.name=tests.test_exact_resume:recording_model`) prints the ids of every training batch it
sees with `tf.print` into one file per replica (`replica-<r>.txt`, one line per micro-batch, in
the order the replica ran them), then trains a small dropout MLP on the other features.
Interruptions are real: SIGKILL of a `tftrain train` (or of one `tftrain launch` worker) at a
random step after a backup (drawn from KILL_SEED), and in-process runs that crash with an
exception at a step.
"""
import json
import os
import random
import re
import signal
import threading
import time

import numpy as np
import pytest

from tests.conftest import REPO, Crash, crash_at
from tests.launch_testutil import Running

NUM_TRAIN, NUM_EVAL, FEATURES, CLASSES = 300, 40, 5, 3
BATCH, SEED = 16, 42  # data.batch_size (global) and the default train.seed
STEPS_PER_EPOCH = NUM_TRAIN // BATCH  # 18: two epochs cross a pass boundary inside a batch
BOUND = 240  # seconds any one run here may take before the test calls it a hang
KILL_SEED = 20260405  # draws the step to kill at; printed and in the failure messages: replay it


def hold_at_gate(gate: str, recorded: int, hold_at: int) -> None:
    """In the training process: once `recorded` batches reach `hold_at`, create `<gate>.held`
    and wait until the file `gate` exists (at most BOUND seconds), so that a test kills the
    process at a known step however fast it runs. The process has nothing to wait on but the
    file the test creates, so it looks for it every 10 ms."""
    if not gate or recorded < hold_at or os.path.exists(gate):
        return
    open(f"{gate}.held", "w").close()
    deadline = time.monotonic() + BOUND
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)


def recording_model(input_shape, num_classes, ids_dir="", dropout=0.3, hold_at=0, gate="",
                    width=16):
    """Prints the ids (feature 0) of each training batch to `ids_dir`/replica-<r>.txt, then
    a dense layer of `width` units, dropout and the logits on the other features (a large
    `width` makes each backup's write last). With `gate`, a training batch
    once `hold_at` batches are recorded waits (bounded) until the file `gate` exists, after
    creating `<gate>.held`: a test kills the process there, at a known step, however fast it is."""
    import tensorflow as tf
    import tf_keras as keras

    def hold(ids):
        path = os.path.join(ids_dir, "replica-0.txt")
        hold_at_gate(gate, open(path).read().count("\n") if os.path.exists(path) else 0,
                     hold_at)
        return ids

    class RecordIds(keras.layers.Layer):
        def call(self, inputs, training=None):
            if training:
                context = tf.distribute.get_replica_context()
                replica = tf.get_static_value(context.replica_id_in_sync_group) if context else 0
                path = os.path.join(ids_dir, f"replica-{int(replica)}.txt")
                ids = tf.cast(inputs[:, 0], tf.int64)
                if gate:
                    ids = tf.py_function(hold, [ids], tf.int64)
                tf.print(ids, output_stream="file://" + path, summarize=-1)
            return inputs[:, 1:]

    inputs = keras.Input(input_shape, name="inputs")
    x = keras.layers.Dense(width, activation="relu")(RecordIds()(inputs))
    x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="recording")


@pytest.fixture(scope="module")
def id_data(tmp_path_factory):
    """A 3-shard classification dataset whose feature 0 is a unique example id."""
    from pipelines import load_pipeline
    from tftrain.data.writer import write_dataset

    root = tmp_path_factory.mktemp("ids")
    rng = np.random.default_rng(0)
    arrays, start = {}, 0
    for split, count in (("train", NUM_TRAIN), ("validation", NUM_EVAL), ("test", NUM_EVAL)):
        x = rng.normal(size=(count, FEATURES)).astype(np.float32)
        x[:, 0] = np.arange(start, start + count)
        arrays[f"x_{split}"], arrays[f"y_{split}"] = x, rng.integers(0, CLASSES, count)
        start += count
    np.savez(root / "ids.npz", **arrays)
    write_dataset(load_pipeline("numpy"), str(root / "ids.npz"), str(root / "data"), num_shards=3,
                  workers=1, progress=False)
    return str(root / "data")


def overrides(data_dir, ids_dir, hold_at=0, gate="", width=16, **extra) -> str:
    held = f", hold_at: {hold_at}, gate: '{gate}'" if gate else ""
    held += f", width: {width}" if width != 16 else ""
    values = {"data.dir": data_dir, "data.batch_size": BATCH, "data.shuffle_buffer": 64,
              "train.epochs": 2, "train.backup_every_steps": 5,
              "model.name": "tests.test_exact_resume:recording_model",
              "model.params": f"{{ids_dir: '{ids_dir}'{held}}}", **extra}
    return ",".join(f"{key}={value}" for key, value in values.items())


def read_ids(ids_dir) -> dict[int, list[tuple[int, ...]]]:
    """replica -> the id tuples of its micro-batches, in the order it trained on them."""
    found = {}
    for name in sorted(os.listdir(ids_dir)):
        replica = int(re.match(r"replica-(\d+)\.txt$", name).group(1))
        with open(os.path.join(ids_dir, name)) as f:
            text = f.read()
        assert not text or text.endswith("\n"), f"{name} ends in a partial line"
        found[replica] = [tuple(int(i) for i in re.findall(r"-?\d+", line))
                          for line in text.splitlines()]
    return found


def steps_before(summary: dict, steps_per_epoch: int) -> int:
    """The steps the interrupted attempt had backed up: where the resumed one started."""
    epoch, step = summary["resumed_from"]
    return epoch * steps_per_epoch + step


def check_same_batches(reference, interrupted, resumed, kept_steps, replay="", per_step=1):
    """interrupted[:kept] + resumed == reference, replica by replica, step for step; `replay`
    (how the interruption was drawn) is in every failure message."""
    assert reference.keys() == resumed.keys() and reference, replay
    for replica, expected in reference.items():
        joined = interrupted[replica][:kept_steps * per_step] + resumed[replica]
        assert len(joined) == len(expected), (replay, replica, len(joined), len(expected))
        for step, (got, want) in enumerate(zip(joined, expected)):
            assert got == want, f"{replay}: replica {replica}, micro-batch {step}: {got} != {want}"


# ---- real processes: SIGKILL at a random step, the same command again -----------------------

def _train(model_dir, overrides_text, env=None) -> Running:
    return Running(["train", f"--model_dir={model_dir}", f"--params_override={overrides_text}"],
                   cwd=REPO, env=env)


def _kill_after_backup(run: Running, model_dir, ids_file, min_lines: int, victim=None,
                       held: str = "") -> None:
    """SIGKILLs `run` (or the process `victim()` names) once it has backed up and trained at
    least `min_lines` batches (and, with `held`, once that file says it waits at a gate)."""
    marker = os.path.join(model_dir, "backup", "chief", "checkpoint")
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        lines = 0
        if os.path.exists(ids_file):
            with open(ids_file) as f:
                lines = f.read().count("\n")
        if lines >= min_lines and os.path.exists(marker) and (not held or os.path.exists(held)):
            if victim:
                os.kill(victim(), signal.SIGKILL)
            else:
                run.kill_all()
            return
        assert run.process.poll() is None, "training ended before the kill:\n" + run.tail()
        time.sleep(0.05)
    raise AssertionError("no backup and progress within the bound:\n" + run.tail())


def _same_run(ids: dict, dumps: dict, interrupted: dict, kept: int, replay: str) -> float:
    """Checks that the interrupted and resumed attempts read the reference run's batches;
    returns the largest weight difference between the resumed run and the reference."""
    everything = read_ids(ids["resumed"])
    resumed = {r: lines[len(interrupted[r]):] for r, lines in everything.items()}
    check_same_batches(read_ids(ids["reference"]), interrupted, resumed, kept, replay)
    return max(float(np.max(np.abs(a - b))) for a, b in
               zip(_weights(dumps["reference"]), _weights(dumps["resumed"])))


def _weights(dump_dir, name="worker-0.npz") -> list:
    with np.load(os.path.join(dump_dir, name)) as npz:
        return [npz[key] for key in npz.files]


def _train_in_process(model_dir, overrides_text, monkeypatch, dump_dir=None) -> dict:
    """`tftrain train` in this process (cheaper than a new one: TensorFlow is loaded)."""
    from tftrain import config as config_lib
    from tftrain.engine import train

    if dump_dir:
        monkeypatch.setenv("TFTRAIN_DUMP_WEIGHTS_DIR", str(dump_dir))
    try:
        return train.train(config_lib.build_config("digits", overrides=overrides_text),
                           str(model_dir))
    finally:
        monkeypatch.delenv("TFTRAIN_DUMP_WEIGHTS_DIR", raising=False)


@pytest.mark.parametrize("devices", [2], ids=["mirrored_2_cpus"])
def test_sigkill_at_a_random_step_then_the_same_command(tmp_path, id_data, devices, monkeypatch,
                                                        restore_determinism):
    """train.deterministic=true with dropout and a moving average of the weights: a `tftrain
    train` process SIGKILLed at a random step after a backup, resumed by the same config (in
    this process): the same batches step for step as the uninterrupted run (also in this
    process), and its weights and their average (measured and printed, within 1e-6). One
    device: the test below, killed during a backup's write."""
    extra = {"train.deterministic": "true", "train.ema_decay": 0.9}
    if devices == 2:
        extra.update({"runtime.strategy": "mirrored", "runtime.cpu_devices": 2})
    dumps = {name: tmp_path / f"weights-{name}" for name in ("reference", "resumed")}
    ids = {name: tmp_path / f"ids-{name}" for name in ("reference", "resumed")}
    for path in ids.values():
        path.mkdir()
    kill_at = random.Random(KILL_SEED + devices).randint(7, 2 * STEPS_PER_EPOCH - 6)  # > a backup
    print(f"\nKILL_SEED={KILL_SEED}: SIGKILL after {kill_at} batches")
    # The killed attempt holds at batch kill_at + 1 until `gate` exists: the kill lands there
    # however fast the process runs. Every run has the same graph (the reference's gate is open).
    gate, open_gate = tmp_path / "gate", tmp_path / "gate-open"
    open_gate.touch()
    resumed_overrides = overrides(id_data, ids["resumed"], kill_at, gate, **extra)

    first = _train(tmp_path / "run", resumed_overrides)
    failures = []

    def kill():
        try:
            _kill_after_backup(first, str(tmp_path / "run"),
                               str(ids["resumed"] / "replica-0.txt"), kill_at,
                               held=f"{gate}.held")
        except BaseException as e:  # reported by the test thread
            failures.append(e)
        finally:
            gate.touch()  # the resumed run (the same command) goes through

    killer = threading.Thread(target=kill)
    killer.start()
    try:  # the uninterrupted run, meanwhile
        _train_in_process(tmp_path / "reference",
                          overrides(id_data, ids["reference"], kill_at, open_gate, **extra),
                          monkeypatch, dumps["reference"])
        killer.join(BOUND)
    finally:
        first.kill_all()
    replay = f"KILL_SEED={KILL_SEED}, killed after {kill_at} batches"
    assert not failures, (replay, failures)
    interrupted = read_ids(ids["resumed"])
    summary = _train_in_process(tmp_path / "run", resumed_overrides, monkeypatch, dumps["resumed"])

    kept = steps_before(summary, STEPS_PER_EPOCH)
    assert 0 < kept < 2 * STEPS_PER_EPOCH and summary["steps"] == 2 * STEPS_PER_EPOCH, replay
    # the dump: the exported average of the 2 dense layers' 4 weights, then the training ones
    assert summary["ema"]["evaluated"] and len(_weights(dumps["resumed"])) == 8, replay
    difference = _same_run(ids, dumps, interrupted, kept, replay)
    print(f"\n{devices} device(s): killed after {len(interrupted[0])} steps, resumed at step "
          f"{kept}; max |weight difference| vs. the uninterrupted run: {difference:.3g}")
    assert difference <= 1e-6, replay


def gated_image_model(input_shape, num_classes, count_file="", hold_at=0, gate=""):
    """A small image classifier with dropout whose training batches each append a line to
    `count_file`; with `gate`, the batch after `hold_at` recorded ones waits (bounded) for
    the file `gate` (`hold_at_gate`)."""
    import tensorflow as tf
    import tf_keras as keras

    def count(images):
        hold_at_gate(gate, open(count_file).read().count("\n")
                     if os.path.exists(count_file) else 0, hold_at)
        with open(count_file, "a") as f:
            f.write("batch\n")
        return images

    class CountBatches(keras.layers.Layer):
        def call(self, inputs, training=None):
            if training:
                counted = tf.py_function(count, [inputs], inputs.dtype)
                return tf.ensure_shape(counted, inputs.shape)
            return inputs

    inputs = keras.Input(input_shape, name="inputs")
    x = keras.layers.Conv2D(4, 3, activation="relu")(CountBatches()(inputs))
    x = keras.layers.Dropout(0.3)(keras.layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="gated")


@pytest.fixture(scope="module")
def jpeg_records(tmp_path_factory):
    """The ImageNet-layout JPEG records (tests/imagenet_layout.py), written once."""
    from tests import imagenet_layout

    return imagenet_layout.write(str(tmp_path_factory.mktemp("jpegs") / "records"))


AUGMENTED_BATCH = 8  # 72 training images: 9 steps per epoch


def test_sigkill_with_augmentation_then_the_same_command(tmp_path, jpeg_records, monkeypatch,
                                                         restore_determinism):
    """data.augment's crop (JPEG windows), flip, mixup and cutmix with train.deterministic: a
    `tftrain train` process SIGKILLed at a random step after a backup, resumed by the same
    config, ends with the uninterrupted run's weights (within 1e-6): every draw is keyed by
    the batch's position, not by what ran before."""
    from tests import imagenet_layout

    steps_per_epoch = 3 * imagenet_layout.PER_CLASS["train"] // AUGMENTED_BATCH
    kill_at = random.Random(KILL_SEED).randint(6, 2 * steps_per_epoch - 4)
    replay = f"KILL_SEED={KILL_SEED}, killed after {kill_at} batches"
    gate, open_gate = tmp_path / "gate", tmp_path / "gate-open"
    open_gate.touch()

    def augmented(name, gate_file):
        params = (f"{{count_file: '{tmp_path / name}.txt', hold_at: {kill_at}, "
                  f"gate: '{gate_file}'}}")
        return imagenet_layout.overrides(jpeg_records, **{
            "data.batch_size": AUGMENTED_BATCH, "data.shuffle_buffer": 64, "train.epochs": 2,
            "train.backup_every_steps": 4, "train.deterministic": "true",
            "train.learning_rate": 0.01,
            "model.name": "tests.test_exact_resume:gated_image_model", "model.params": params,
            "data.augment": "{random_resized_crop: true, flip: true, mixup_alpha: 0.2, "
                            "cutmix_alpha: 1.0}"})

    dumps = {name: tmp_path / f"weights-{name}" for name in ("reference", "resumed")}
    first = _train(tmp_path / "run", augmented("resumed", gate))
    failures = []

    def kill():
        try:
            _kill_after_backup(first, str(tmp_path / "run"), str(tmp_path / "resumed.txt"),
                               kill_at, held=f"{gate}.held")
        except BaseException as e:  # reported by the test thread
            failures.append(e)
        finally:
            gate.touch()

    killer = threading.Thread(target=kill)
    killer.start()
    try:
        _train_in_process(tmp_path / "reference", augmented("reference", open_gate), monkeypatch,
                          dumps["reference"])
        killer.join(BOUND)
    finally:
        first.kill_all()
    assert not failures, (replay, failures)
    summary = _train_in_process(tmp_path / "run", augmented("resumed", gate), monkeypatch,
                                dumps["resumed"])
    kept = steps_before(summary, steps_per_epoch)
    assert 0 < kept < 2 * steps_per_epoch and summary["steps"] == 2 * steps_per_epoch, replay
    difference = max(float(np.max(np.abs(a - b))) for a, b in
                     zip(_weights(dumps["reference"]), _weights(dumps["resumed"])))
    print(f"\n{replay}; resumed at step {kept}; max |weight difference| vs. the "
          f"uninterrupted run: {difference:.3g}")
    assert difference <= 1e-6, replay


WIDE = 300_000  # the recording model's width: 2.4M weights, ~29 MB per backup with Adam's


def _kill_during_a_write(run: Running, model_dir, ids_file, min_lines: int) -> list[str]:
    """SIGKILLs `run` while a backup is being written in the background, once it has trained
    `min_lines` batches and made one backup current: when a checkpoint's temporary directory
    appears, the process is stopped (SIGSTOP freezes the writing thread too) and, if the
    directory is still there, killed; returns the temporary directories left at the kill."""
    chief = os.path.join(model_dir, "backup", "chief")
    deadline = time.monotonic() + BOUND
    while not (os.path.exists(os.path.join(chief, "checkpoint")) and os.path.exists(ids_file)
               and open(ids_file).read().count("\n") >= min_lines):
        assert run.process.poll() is None, "training ended before the kill:\n" + run.tail()
        assert time.monotonic() < deadline, "no backup within the bound:\n" + run.tail()
        time.sleep(0.05)
    while time.monotonic() < deadline:  # the next write: a temporary directory, ~30 ms
        writing = [name for name in os.listdir(chief) if name.endswith("_temp")]
        if writing:
            os.killpg(run.process.pid, signal.SIGSTOP)
            left = [name for name in os.listdir(chief) if name.endswith("_temp")]
            if left:
                run.kill_all()
                return left
            os.killpg(run.process.pid, signal.SIGCONT)  # it finished in between: the next one
        assert run.process.poll() is None, "training ended before a write was caught:\n" + (
            run.tail())
        time.sleep(0.001)
    raise AssertionError("no backup write caught within the bound:\n" + run.tail())


def test_sigkill_during_a_background_backup_write_then_the_same_command(
        tmp_path, id_data, monkeypatch, restore_determinism):
    """train.async_backup (on by default for one device): a `tftrain train` process SIGKILLed
    while a backup's files are being written, after a random step; the same command resumes
    from the backup before it (the half-written one never became current) and ends with the
    uninterrupted run's batches and weights (within 1e-6)."""
    # Backups every 9 steps: one after the epoch's last step (18), still being written when
    # the first validation begins (the model's object graph must not change during a write).
    extra = {"train.deterministic": "true", "width": WIDE, "train.backup_every_steps": 9}
    dumps = {name: tmp_path / f"weights-{name}" for name in ("reference", "resumed")}
    ids = {name: tmp_path / f"ids-{name}" for name in ("reference", "resumed")}
    for path in ids.values():
        path.mkdir()
    after = random.Random(KILL_SEED).randint(6, 2 * STEPS_PER_EPOCH - 12)
    replay = f"KILL_SEED={KILL_SEED}: killed during the first backup write after {after} batches"
    resumed_overrides = overrides(id_data, ids["resumed"], **extra)
    first = _train(tmp_path / "run", resumed_overrides)
    try:
        partial = _kill_during_a_write(first, str(tmp_path / "run"),
                                       str(ids["resumed"] / "replica-0.txt"), after)
    finally:
        first.kill_all()
    assert partial, replay  # the kill left a write unfinished (its temporary directory)
    interrupted = read_ids(ids["resumed"])
    summary = _train_in_process(tmp_path / "run", resumed_overrides, monkeypatch,
                                dumps["resumed"])
    assert summary["backup"]["async"] is True and summary["backup"]["count"] > 0, summary
    kept = steps_before(summary, STEPS_PER_EPOCH)
    assert 0 < kept <= len(interrupted[0]), (replay, kept)
    _train_in_process(tmp_path / "reference", overrides(id_data, ids["reference"], **extra),
                      monkeypatch, dumps["reference"])
    difference = _same_run(ids, dumps, interrupted, kept, replay)
    print(f"\n{replay}; resumed at step {kept} with {partial} left unfinished; max |weight "
          f"difference| vs. the uninterrupted run: {difference:.3g}")
    assert difference <= 1e-6, replay


# ---- the stream an uninterrupted input pipeline yields, step for step ----------------------

def stream_ids(data_dir, steps: int, per_replica_batch: int, accum: int = 1, workers: int = 1,
               worker: int = 0, **load_kwargs) -> list[tuple[int, ...]]:
    """The ids of the micro-batches one replica of worker `worker` trains on in `steps` steps
    when nothing interrupts it: its input pipeline read from the start, in order."""
    import tensorflow as tf

    from tftrain.data import reader

    context = (tf.distribute.InputContext(workers, worker, workers) if workers > 1 else None)
    dataset = reader.load(data_dir, "train", per_replica_batch * accum, training=True,
                          repeat=True, seed=SEED, shuffle_buffer=64, input_context=context,
                          **load_kwargs)
    batches = []
    for x, _ in dataset.take(steps).as_numpy_iterator():
        ids = x[:, 0].astype(np.int64)
        batches += [tuple(ids[i:i + per_replica_batch]) for i in range(0, len(ids), per_replica_batch)]
    return batches


# ---- 2 MultiWorkerMirrored workers on loopback: one SIGKILLed, the same launch again -----

def test_two_workers_one_killed_then_the_same_launch(tmp_path, id_data):
    """Each worker reads its own shard files (FILE sharding: 2 of the 3 files for worker 0,
    1 for worker 1); after the relaunch, each continues its own stream where the backup was."""
    ids_dir = tmp_path / "ids"
    ids_dir.mkdir()
    args = ["launch", "--num_workers=2", f"--timeout={BOUND}", "--grace=5", "--", "train",
            f"--model_dir={tmp_path / 'run'}", f"--params_override={overrides(id_data, ids_dir)}"]
    kill_at = random.Random(KILL_SEED).randint(7, 2 * STEPS_PER_EPOCH - 6)
    replay = f"KILL_SEED={KILL_SEED}, worker 1 killed after {kill_at} batches"
    print(f"\n{replay}")
    first = Running(args, cwd=REPO)
    try:
        _kill_after_backup(first, str(tmp_path / "run"), str(ids_dir / "replica-1.txt"),
                           kill_at, victim=lambda: first.worker_pids()[1])
        assert first.wait(120) != 0, replay  # the launcher notices and stops the chief
    finally:
        first.kill_all()
    assert "[launch] worker 1 was killed by SIGKILL; stopping the other workers" in first.output
    assert "Its last lines:" in first.output
    assert not (tmp_path / "run/summary.json").exists()  # not a finished run
    interrupted = read_ids(ids_dir)
    second = Running(args, cwd=REPO)
    try:
        assert second.wait(BOUND) == 0, (replay, second.tail())
    finally:
        second.kill_all()
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["num_workers"] == 2 and summary["steps"] == 2 * STEPS_PER_EPOCH, replay
    kept = steps_before(summary, STEPS_PER_EPOCH)
    everything = read_ids(ids_dir)
    resumed = {r: lines[len(interrupted[r]):] for r, lines in everything.items()}
    reference = {w: stream_ids(id_data, 2 * STEPS_PER_EPOCH, BATCH // 2, workers=2, worker=w)
                 for w in range(2)}
    check_same_batches(reference, interrupted, resumed, kept, replay)
    assert not set(sum(reference[0], ())) & set(sum(reference[1][:6], ()))  # disjoint files


# ---- in process: a crash at a step (an exception out of `fit`), then the same config --------


@pytest.mark.parametrize("variant,accum,crash_step", [
    # 9 steps per epoch, backed up after step 5; decoded examples from the cache
    ({"train.grad_accum_steps": 2, "data.cache": "decoded"}, 2, 8),
    # backed up after step 12 (backups at the ends of executions); records from the cache
    ({"train.steps_per_execution": 3, "data.cache": "records"}, 1, 15),
], ids=["grad_accum_2_cache_decoded", "steps_per_execution_3_cache_records"])
def test_crash_then_resume_in_process(tmp_path, id_data, monkeypatch, variant, accum,
                                      crash_step):
    from tftrain import config as config_lib
    from tftrain.engine import train

    ids_dir = tmp_path / "ids"
    ids_dir.mkdir()
    config = config_lib.build_config("digits", overrides=overrides(id_data, ids_dir, **variant))
    steps_per_epoch = NUM_TRAIN // (BATCH * accum)
    total = 2 * steps_per_epoch
    make_callbacks = train.make_callbacks
    monkeypatch.setattr(train, "make_callbacks",
                        lambda *a, **k: make_callbacks(*a, **k) + [crash_at(crash_step)])
    with pytest.raises(Crash):
        train.train(config, str(tmp_path / "run"))
    monkeypatch.setattr(train, "make_callbacks", make_callbacks)
    interrupted = read_ids(ids_dir)
    summary = train.train(config, str(tmp_path / "run"))
    kept = steps_before(summary, steps_per_epoch)
    assert 0 < kept < crash_step and summary["steps"] == total
    everything = read_ids(ids_dir)
    resumed = {r: lines[len(interrupted[r]):] for r, lines in everything.items()}
    load_kwargs = {"cache": config.data.cache}
    reference = {0: stream_ids(id_data, total, BATCH, accum=accum, **load_kwargs)}
    check_same_batches(reference, interrupted, resumed, kept, per_step=accum)

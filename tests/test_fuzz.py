"""Fuzzing tftrain with hostile and damaged input (issues #23, #41): seeded mutations of
manifests, shard bytes, YAML configs and CSV/JSONL rows, and of records' content in files whose
framing, checksums and manifest stay valid (labels, types, image sizes, token ids and window
lengths, garbage payloads, label counts recounted or not: inspect --verify, then train, evaluate,
prune or quantize on them),
each run through the real CLI.

Every case must end with exit 0 and a correct result, or with a non-zero exit and one error
line: no traceback, no signal, no hang; and a sentinel directory outside every target (which the
cases link to from inside them) must be unchanged after every case. The cases run in one driver
process (tests/fuzz_driver.py, forked: `tests/forked_cli.py`), restarted after a crash or a hang.

    TFTRAIN_FUZZ_SEED (default 23), TFTRAIN_FUZZ_CASES (default 300), TFTRAIN_FUZZ_FIRST (0)
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests import forked_cli
from tests.conftest import REPO

SEED = int(os.environ.get("TFTRAIN_FUZZ_SEED", "23"))
CASES = int(os.environ.get("TFTRAIN_FUZZ_CASES", "300"))
FIRST = int(os.environ.get("TFTRAIN_FUZZ_FIRST", "0"))
CASE_TIMEOUT = 90  # seconds: a training case takes ~2 s; a hang never ends
START_TIMEOUT = 180
_LOG_LINE = re.compile(r"^[IWEF]\d{4} |^WARNING: All log messages|^\d+/\d+ |^Epoch ")


def snapshot(path) -> dict:
    """Every entry under `path` (not following links): its kind, size and content hash."""
    found = {}
    for directory, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(directory, name)
            if os.path.islink(full) or os.path.isdir(full):
                found[os.path.relpath(full, path)] = "link" if os.path.islink(full) else "dir"
            else:
                with open(full, "rb") as f:
                    found[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
    return found


def verdict(result: dict) -> str | None:
    """What is wrong with one command's outcome, or None."""
    if result["problem"]:
        return (f"exit 0 with a wrong result: {result['problem']}" if result["code"] == 0
                else result["problem"])
    if result["code"] == 0:
        return None
    err = result["stderr"]
    if "Traceback" in err:
        return "a traceback: " + " | ".join(err.strip().splitlines()[-3:])
    if result["command"] == "check" and result["code"] == 1 and "would fail" in result["stdout"]:
        return None  # its answer: the report on stdout says which check failed and why
    errors = [line for line in err.splitlines() if ": error: " in line]
    if len(errors) != 1:
        shown = err.strip() or "stdout: " + result["stdout"].strip()
        shown = shown if len(shown) < 600 else f"{shown[:300]} ... {shown[-300:]}"
        return f"exit {result['code']} with {len(errors)} error lines: {shown!r}"
    return None


class Driver:
    """The driver process, read line by line with timeouts: forked from the server that
    imported TensorFlow once (`tests/forked_cli.py`), in its own session; a fresh interpreter is
    not what is tested (the driver runs every command in-process anyway)."""

    def __init__(self, work: str, first: int, count: int):
        with open(os.path.join(work, "driver.log"), "a") as log:
            self.process = forked_cli.Popen(
                [work, str(SEED), str(first), str(count)], entry="tests.fuzz_driver:main",
                cwd=REPO, stdout=forked_cli.PIPE, stderr=log, text=False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.process.stdout, selectors.EVENT_READ)

    pending = b""  # read from the pipe, not yet a whole line

    def next_event(self, timeout: float) -> dict | None:
        """The next JSON line, or None on a timeout or when the driver died."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self.pending:
                line, self.pending = self.pending.split(b"\n", 1)
                if line.startswith(b"{"):
                    return json.loads(line)
            left = deadline - time.monotonic()
            if left <= 0 or not self.selector.select(timeout=left):
                return None
            chunk = os.read(self.process.stdout.fileno(), 1 << 16)
            if not chunk:
                return None
            self.pending += chunk

    def stop(self) -> str:
        """Kills the driver's whole process group; returns how it ended."""
        try:
            code = self.process.wait(timeout=5)  # a driver that died is reaped first
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            return "hang (killed after the timeout)"
        return f"signal {-code}" if code < 0 else f"exit {code}"


def run_cases(work: str, first: int, count: int) -> tuple[list, collections.Counter]:
    """Runs cases first..first+count-1; returns the failures and the outcomes per kind."""
    sentinel = os.path.join(work, "sentinel")
    before = snapshot(sentinel)
    failures, outcomes, index = [], collections.Counter(), first
    while index < first + count:
        driver = Driver(work, index, first + count - index)
        try:
            assert driver.next_event(START_TIMEOUT) == {"event": "ready"}, "the driver did not start"
            while index < first + count:
                started = driver.next_event(CASE_TIMEOUT)
                ended = started and driver.next_event(CASE_TIMEOUT)
                if not ended:
                    how = driver.stop()
                    failures.append((index, started, how))
                    outcomes[(started or {}).get("kind", "?"), how] += 1
                    index += 1
                    break
                for result in ended["results"]:
                    problem = verdict(result)
                    outcomes[started["kind"], f"{result['command']} exit {result['code']}"] += 1
                    if problem:
                        failures.append((index, started, f"{result['command']}: {problem}"))
                if snapshot(sentinel) != before:
                    failures.append((index, started, "the sentinel directory changed"))
                    before = snapshot(sentinel)
                index += 1
        finally:
            driver.stop()
    return failures, outcomes


def report(failures, outcomes, seconds: float, count: int) -> str:
    lines = [f"{count} fuzz cases (seed {SEED}) in {seconds:.0f} s:"]
    lines += [f"  {kind:<8} {outcome:<28} {n}" for (kind, outcome), n in sorted(outcomes.items())]
    for index, started, problem in failures[:30]:
        lines.append(f"case {index} ({(started or {}).get('what', 'not started')}): {problem}")
    return "\n".join(lines)


@pytest.fixture
def work(tmp_path):
    (tmp_path / "sentinel" / "sub").mkdir(parents=True)
    (tmp_path / "sentinel" / "keep.txt").write_text("precious")
    (tmp_path / "sentinel" / "sub" / "deep.txt").write_text("also precious")
    return str(tmp_path)


def test_hostile_input_never_crashes_hangs_or_touches_the_outside(work, digits_dir):
    # The undamaged digits dataset the cases copy: the session's, converted as the driver's
    # build_bases would convert it (which then keeps it).
    shutil.copytree(digits_dir, os.path.join(work, "bases", "digits"))
    started = time.monotonic()
    failures, outcomes = run_cases(work, FIRST, CASES)
    text = report(failures, outcomes, time.monotonic() - started, CASES)
    print(text)
    assert not failures, text
    assert sum(outcomes.values()) >= CASES  # every case ran at least one command
    if CASES >= 100:  # the content cases met damage and sound content, and trained on damage
        content = {outcome for kind, outcome in outcomes if kind == "content"}
        assert {"inspect exit 0", "inspect exit 1", "train exit 1"} <= content, text


def test_the_harness_catches_each_kind_of_failure(work):
    """A traceback, several error lines, a wrong exit-0 result, a signal and a hang are each
    reported (the last two by running the driver in a mode that crashes or sleeps)."""
    def result(code, stderr, problem=None):
        return {"command": "inspect", "code": code, "stderr": stderr, "stdout": "",
                "problem": problem}

    assert verdict(result(1, "Traceback (most recent call last):\n x"))
    assert verdict(result(1, "tftrain a: error: x\ntftrain a: error: y"))
    assert verdict(result(1, ""))
    assert verdict(result(0, "", "shard differs"))
    assert verdict(result(2, "I1202 log\ntftrain a: error: one line")) is None
    for mode, expected in (("crash", "signal 11"), ("hang", "hang")):
        driver = subprocess.Popen(
            [sys.executable, "-c", "import json, os, signal, time\n"
             "print(json.dumps({'event': 'ready'}), flush=True)\n"
             "print(json.dumps({'case': 0, 'event': 'start', 'kind': 'self'}), flush=True)\n"
             + ("os.kill(os.getpid(), signal.SIGSEGV)" if mode == "crash" else "time.sleep(60)")],
            stdout=subprocess.PIPE, start_new_session=True)
        harness = Driver.__new__(Driver)
        harness.process, harness.selector = driver, selectors.DefaultSelector()
        harness.selector.register(driver.stdout, selectors.EVENT_READ)
        assert harness.next_event(30) == {"event": "ready"}
        assert harness.next_event(30)["event"] == "start"
        assert harness.next_event(2) is None
        assert expected in harness.stop()


def test_the_content_check_tells_damage_from_sound_content(tmp_path, digits_dir):
    """The fuzzer's own check of a content case (protobuf alone, not tftrain's verify): sound
    digits pass; a label outside the classes, an image of other bytes and, with `counts`, label
    counts that the records do not match are each caught, and a sound but extra feature is not."""
    import random

    from tests import fuzz_driver

    dataset = str(tmp_path / "digits")
    shutil.copytree(digits_dir, dataset)
    everything = ["train", "validation", "test"]
    assert fuzz_driver.content_problem(dataset, everything, counts=True) is None
    path, records = fuzz_driver.split_records(dataset, "test")
    original = list(records)
    for how, expected in (("label 999", "test record 7 cannot"), ("image_short", "test record 7 "
                          "cannot"), ("extra_feature", None), ("label 3", None)):
        rng = next(random.Random(seed) for seed in range(10_000)
                   if fuzz_driver.mutate_record(random.Random(seed), original[7])[1] == how)
        records = list(original)
        records[7], _ = fuzz_driver.mutate_record(rng, original[7])
        fuzz_driver.write_records(dataset, "test", path, records, recount=True)
        problem = fuzz_driver.content_problem(dataset, everything, counts=True)
        assert (problem or "").startswith(expected) if expected else problem is None, how
    assert fuzz_driver._label(records[7]) == 3 != fuzz_driver._label(original[7])
    fuzz_driver.write_records(dataset, "test", path, original, recount=True)
    fuzz_driver.write_records(dataset, "test", path, records, recount=False)  # counts now stale
    assert fuzz_driver.content_problem(dataset, ["test"], counts=False) is None
    assert "label counts differ" in fuzz_driver.content_problem(dataset, ["test"], counts=True)
    fuzz_driver.write_records(dataset, "test", path, original, recount=True)
    check = fuzz_driver.content_check(dataset, ["test"])
    assert check(0, "") is None and check(1, "tftrain prune: error: pruning lost too much") is None
    assert check(1, "tftrain train: error: something else").startswith("exit 1 on sound content")


def test_the_content_check_tells_damaged_token_windows(tmp_path, text_dir):
    """Token windows: sound ones pass; an id past the vocabulary, a negative one and a window
    of another length are caught; a valid id change is not."""
    import random

    from tests import fuzz_driver

    dataset = str(tmp_path / "text")
    shutil.copytree(text_dir, dataset)
    assert fuzz_driver.content_problem(dataset, ["validation"], counts=False) is None
    path, original = fuzz_driver.split_records(dataset, "validation")
    vocab = json.load(open(os.path.join(dataset, "dataset.json")))["info"]["vocab_size"]
    seen = set()
    for seed in range(200):
        records = list(original)
        records[4], how = fuzz_driver.mutate_tokens(random.Random(seed), original[4], vocab)
        kind = how.split(" = ")[-1] if how.startswith("token") else how
        fuzz_driver.write_records(dataset, "validation", path, records, recount=False)
        problem = fuzz_driver.content_problem(dataset, ["validation"], counts=False)
        damaged = not (kind == "5" or how == "valid")
        assert (problem == "validation record 4 cannot be trained on") == damaged, how
        seen.add(damaged)
    assert seen == {True, False}


def test_a_refused_config_leaves_no_run_directory(tmp_path, digits_dir, cli, capsys):
    """`tftrain train` on the fuzzer's damaged configs (its yaml cases, as it makes them) and on
    configs refused only once TensorFlow runs (a batch larger than the split, a helper module as
    the pipeline, no class count for other tools' records): one error line, no --model_dir."""
    import random

    from tests import fuzz_driver
    from tftrain import config as config_lib
    from tftrain.errors import TftrainError

    bases = {"tiny.yaml": str(tmp_path / "tiny.yaml"), "dataset": digits_dir}
    (tmp_path / "tiny.yaml").write_text(
        "data:\n  dir: DATA\n  batch_size: 32\nmodel:\n  name: mlp\n  params: {hidden_units: "
        "[8]}\ntrain:\n  epochs: 1\n  steps_per_epoch: 2\n")
    commands = []
    for index in range(CASES):
        rng = random.Random(f"{SEED}:{index}")
        if fuzz_driver.KINDS[rng.randrange(len(fuzz_driver.KINDS))] != "yaml":
            continue
        case_dir = tmp_path / f"case{index}"
        case_dir.mkdir()
        fuzz_driver.config_case(rng, index, "yaml", bases, str(case_dir), None)
        try:  # a damaged config that is still valid would train: not a refusal
            config_lib.build_config(str(case_dir / "c.yaml"))
            continue
        except TftrainError:
            commands.append((f"--config={case_dir / 'c.yaml'}",))
    assert len(commands) >= CASES // 15, "too few refused configs among the fuzzer's cases"
    shutil.copytree(digits_dir, tmp_path / "foreign", ignore=shutil.ignore_patterns("*.json"))
    for late in ("data.batch_size=5000", "data.format=tfrecord,data.pipeline=images",
                 f"data.dir={tmp_path / 'foreign'},data.format=tfrecord,data.pipeline=digits"):
        commands.append(("--config=digits", f"--params_override=data.dir={digits_dir},{late}"))
    for number, args in enumerate(commands):
        run = tmp_path / "runs" / str(number)
        assert cli("train", f"--model_dir={run}", *args) != 0, args
        errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
        assert len(errors) == 1, (args, errors)
        assert not run.exists(), (args, errors)

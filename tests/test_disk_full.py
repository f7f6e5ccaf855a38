"""A full disk ends `convert` and `train` with one clear line, and nothing half-written is
trusted: the converter leaves no dataset, and the rerun of a training run resumes from its backup.

The disk is a real one: a small tmpfs mounted for the test (the tests run as root, as CI does).
"""
import contextlib
import json
import os
import subprocess
import time

import pytest

from tests import forked_cli

ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


@contextlib.contextmanager
def small_disk(path, size: str):
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path) -> str:
    """Fills the disk under `path` to the last byte; returns the filler's path."""
    filler = os.path.join(path, "filler")
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError:
            pass
    with contextlib.suppress(OSError):
        with open(filler, "ab") as f:  # and the last few bytes
            while True:
                f.write(b"\0")
                f.flush()
    return filler


def complete_backup(run) -> bool:
    """True once a backup's checkpoint state file (written after its data) exists."""
    return any("checkpoint" in files for _, _, files in os.walk(run / "backup"))


def error_lines(stderr: str, command: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(f"tftrain {command}: error:")]


@pytest.mark.slow
def test_convert_onto_a_full_disk_is_one_line_and_leaves_no_dataset(tmp_path):
    with small_disk(tmp_path / "disk", "200k") as disk:
        output = disk / "digits"
        for workers in ("1", "2"):
            result = forked_cli.run(
                ["convert", "--pipeline=digits", f"--output={output}", f"--workers={workers}"],
                timeout=300, env=ENV)
            assert result.returncode == 1, result.stderr[-2000:]
            assert "Traceback" not in result.stderr, result.stderr[-3000:]
            (line,) = error_lines(result.stderr, "convert")
            assert "no space left on device" in line.lower() and "run the same command" in line
            assert not (output / "dataset.json").exists()
            assert not [n for n in os.listdir(output) if n.endswith(".tfrecord")]
        subprocess.run(["mount", "-o", "remount,size=20m", str(disk)], check=True)
        result = forked_cli.run(["convert", "--pipeline=digits", f"--output={output}"],
                                timeout=300, env=ENV)
        assert result.returncode == 0, result.stderr[-2000:]
        verified = forked_cli.run(["inspect", f"--data={output}", "--verify"], timeout=120,
                                  env=ENV)
        assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.slow
def test_train_onto_a_full_disk_is_one_line_and_the_rerun_resumes(tmp_path, digits_dir):
    with small_disk(tmp_path / "disk", "30m") as disk:
        run = disk / "run"
        command = ["train", f"--model_dir={run}",
                   f"--params_override=data.dir={digits_dir},train.epochs=2,"
                   "model.name=mlp,model.params={hidden_units: [32]}"]
        # Its output goes to files beside the small disk, not on it (stdout is not a TTY).
        with open(tmp_path / "train.out", "w") as out, open(tmp_path / "train.err", "w") as err:
            process = forked_cli.Popen(command, stdout=out, stderr=err, env=ENV)
        try:
            deadline = time.monotonic() + 240
            while not complete_backup(run) and process.poll() is None:
                assert time.monotonic() < deadline, "no backup was written"
                time.sleep(0.05)
            filler = fill(disk)  # the next checkpoint, backup or export finds the disk full
            process.wait(timeout=300)
        finally:
            if process.poll() is None:
                process.kill()
        stderr = (tmp_path / "train.err").read_text()
        assert process.returncode == 1, stderr[-3000:]
        assert "Traceback" not in stderr, stderr[-3000:]
        (line,) = error_lines(stderr, "train")
        assert "no space left on device" in line and "resumes from its last backup" in line
        assert not (run / "summary.json").exists()
        os.remove(filler)
        rerun = forked_cli.run(command, timeout=300, env=ENV)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert "resumed from epoch" in rerun.stdout + rerun.stderr
        assert json.loads((run / "summary.json").read_text())["epochs"] == 2

"""Weights after a multi-worker resume: 2 MultiWorkerMirrored workers on loopback, run once
uninterrupted and once with worker 1 SIGKILLed after a backup and the same `tftrain launch`
again, with and without `train.deterministic`. Prints max |weight difference| between the two
runs' chiefs (and between the resumed run's two workers) as a markdown table.

    python bench/multiworker_resume.py [--kill_after_backup=3] [--keep=DIR]

An MLP with dropout 0.3 on digits, 2 epochs of 20 steps, a backup every 5 steps. The digits
dataset is converted into the scratch directory first. Each launch starts 2 TensorFlow
processes, so the whole script takes a few minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

TFTRAIN = [sys.executable, "-c", "import sys; from tftrain.cli import run; "
           "run(['tftrain'] + sys.argv[1:])"]
MODEL = ("model.name=mlp,model.params={hidden_units: [64], dropout: 0.3},train.epochs=2,"
         "train.steps_per_epoch=20,train.backup_every_steps=5,data.batch_size=32")


def launch(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(TFTRAIN + args, env={**os.environ, **env}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def worker_pid(process: subprocess.Popen, lines: list[str], index: int) -> int:
    """Reads the launcher's output until it names worker `index`'s pid."""
    for line in process.stdout:
        lines.append(line)
        if line.startswith(f"[launch] worker {index}: pid "):
            return int(line.split()[-1])
    raise RuntimeError("the launcher ended before starting its workers:\n" + "".join(lines))


def run(scratch: str, name: str, deterministic: bool, kill_after_backup: int | None):
    """One 2-worker run; with `kill_after_backup`, worker 1 is SIGKILLed once the chief's
    backup ckpt-`kill_after_backup` exists, then the same launch runs again. Returns the
    summary and both workers' weights."""
    model_dir, dump = os.path.join(scratch, name), os.path.join(scratch, name + "-weights")
    args = ["launch", "--num_workers=2", "--timeout=600", "--grace=5", "--", "train",
            f"--model_dir={model_dir}", f"--params_override=data.dir={scratch}/digits,{MODEL},"
            f"train.deterministic={str(deterministic).lower()}"]
    env = {"TFTRAIN_DUMP_WEIGHTS_DIR": dump}
    if kill_after_backup:
        lines: list[str] = []
        process = launch(args, env)
        pid = worker_pid(process, lines, 1)
        marker = os.path.join(model_dir, "backup", "chief", f"ckpt-{kill_after_backup}.index")
        while not os.path.exists(marker):
            if process.poll() is not None:
                raise RuntimeError("the run ended before the kill")
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        process.communicate(timeout=120)
    process = launch(args, env)
    output = process.communicate(timeout=900)[0]
    if process.returncode:
        raise RuntimeError(f"{name} failed:\n{output[-3000:]}")
    with open(os.path.join(model_dir, "summary.json")) as f:
        summary = json.load(f)
    weights = [dict(np.load(os.path.join(dump, f"worker-{i}.npz"))) for i in range(2)]
    return summary, weights


def max_difference(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kill_after_backup", type=int, default=3,
                        help="SIGKILL worker 1 once the chief's backup number N exists")
    parser.add_argument("--keep", default="", help="scratch directory to keep (default: temp)")
    flags = parser.parse_args()
    scratch = flags.keep or tempfile.mkdtemp(prefix="tftrain-mw-resume-")
    os.makedirs(scratch, exist_ok=True)
    try:
        subprocess.run(TFTRAIN + ["convert", "--pipeline=digits", f"--output={scratch}/digits"],
                       check=True, capture_output=True)
        rows = []
        for deterministic in (True, False):
            tag = "det" if deterministic else "default"
            _, reference = run(scratch, f"reference-{tag}", deterministic, None)
            summary, resumed = run(scratch, f"resumed-{tag}", deterministic,
                                   flags.kill_after_backup)
            epoch, step = summary["resumed_from"]
            rows.append((f"train.deterministic={str(deterministic).lower()}",
                         f"epoch {epoch + 1} step {step}",
                         max_difference(reference[0], resumed[0]),
                         max_difference(resumed[0], resumed[1]),
                         max(float(np.max(np.abs(v))) for v in reference[0].values())))
        print("| setting | resumed from | max abs(uninterrupted - resumed) | "
              "max abs(worker 0 - worker 1) | max abs(weight) |")
        print("|---|---|---|---|---|")
        for setting, where, difference, workers, largest in rows:
            print(f"| {setting} | {where} | {difference:.3g} | {workers:.3g} | {largest:.3g} |")
    finally:
        if not flags.keep:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()

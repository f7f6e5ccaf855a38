"""Backups every step: what they cost the steps, none vs synchronous vs in the background.

    .venv/bin/python bench/checkpoint.py [--sizes=100m,300m] [--steps=6]
                                         [--workdir=/tmp/tftrain-bench-checkpoint]

Run by hand (minutes per size; 1b needs ~10 GB of memory and writes ~4 GB per backup), not by
the test suite (tests/test_exact_resume.py kills a run during a background write). For each
size of configs/lm_1b.yaml (bench/big_model.py's sizes: 100m, 300m, or 1b as shipped), in one
working directory and one after another on the same data, three runs of `--steps` steps:

    tftrain train --config=lm_1b --params_override=train.steps=N,...,train.backup_every_steps=0
    ... train.backup_every_steps=1,train.async_backup=false      (each backup blocks the step)
    ... train.backup_every_steps=1,train.async_backup=true       (written in the background)

`none` still writes the backup of its one (cut) epoch at the end, after the timed steps. From
each run's summary.json: seconds per step (the warm steps), and `backup`: the backups taken,
the seconds the steps were blocked, the seconds of writing, the bytes written. Prints the CPU
and one table; the ratio is each mode's seconds per step over `none`'s.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.big_data import TFTRAIN, run_measured  # noqa: E402
from bench.big_model import SIZES, open_workdir, remove_output  # noqa: E402
from bench.table import markdown_table  # noqa: E402

GIB = 1 << 30
MODES = {"none": "train.backup_every_steps=0",
         "synchronous": "train.backup_every_steps=1,train.async_backup=false",
         "background": "train.backup_every_steps=1,train.async_backup=true"}


def run(size: str, mode: str, steps: int, work: str) -> dict:
    """One run of `size` backing up as `mode` says; its summary.json and peak memory."""
    run_dir = os.path.join(work, "runs", f"{size}-{mode}")
    remove_output(run_dir, work)
    overrides = ",".join(p for p in (f"train.steps={steps}", "train.validation_steps=1",
                                     "train.test_steps=1", MODES[mode], SIZES[size]) if p)
    _, peak_mb = run_measured([TFTRAIN, "train", "--config=lm_1b", f"--model_dir={run_dir}",
                               f"--params_override={overrides}"], cwd=work)
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    remove_output(run_dir, work)  # the next run needs the disk
    return {"summary": summary, "peak": peak_mb * (1 << 20)}


def rows_of(size: str, results: dict) -> list[list]:
    """The table's lines of one size."""
    base = results["none"]["summary"]["seconds_per_step"]
    rows = []
    for mode, result in results.items():
        summary, backup = result["summary"], result["summary"]["backup"]
        step = summary["seconds_per_step"]
        rows.append([size, f"{summary['parameters']:,}", mode, f"{step:.2f}", f"{step / base:.2f}",
                     backup["count"], f"{backup['blocked_seconds']:.1f}",
                     f"{backup['write_seconds']:.1f}", f"{backup['bytes'] / GIB:.2f}",
                     f"{result['peak'] / GIB:.2f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100m,300m")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--workdir", default="/tmp/tftrain-bench-checkpoint")
    args = parser.parse_args()
    open_workdir(args.workdir)
    rows = []
    for size in args.sizes.split(","):
        results = {}
        for mode in MODES:
            print(f"  {size} {mode} ...", flush=True)
            results[mode] = run(size, mode, args.steps, args.workdir)
        rows += rows_of(size, results)
        for line in rows[-len(MODES):]:
            print("   ", line, flush=True)
    print(markdown_table(
        ["size", "parameters", "backups", "s/step", "vs none", "backups taken",
         "blocked s", "writing s", "GiB written", "peak GiB"], rows))


if __name__ == "__main__":
    main()

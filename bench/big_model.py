"""A billion parameters on this machine: lm_1b's memory plan against what its run measures.

    .venv/bin/python bench/big_model.py [--sizes=1b,300m] [--workdir=/tmp/tftrain-bench-big-model]

Run by hand (minutes per size, ~10 GB of memory and of disk for 1b), not by the test suite,
which runs the same commands on a model of a few million parameters. For each size, in a fresh
working directory, the commands of configs/lm_1b.yaml's header as a user types them (`1b`:
exactly; a smaller size adds its `model.params` to the override):

    tftrain convert --pipeline=text --output=data/lm_1b --pipeline_options=...   (first size)
    tftrain check --config=lm_1b --target=cpu --json=plan.json
    tftrain train --config=lm_1b --model_dir=runs/lm_1b --params_override=train.steps=2

The plan's bytes per device (by part) come from plan.json. The run's peak memory is the peak of
the summed anonymous PSS of its process tree, sampled every 20 ms (bench/big_data.py's
`run_measured`: the page cache of the data and of the TensorFlow library is not the run's),
over the whole command (build, steps, evaluation, export); seconds per step and the parameter count come from summary.json. Prints
the CPU and one table; planned/measured within 0.7-1.3 is the bound the plan promises.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.big_data import TFTRAIN, run_measured  # noqa: E402
from bench.table import markdown_table  # noqa: E402
from tftrain.host import cpu_name  # noqa: E402

GIB = 1 << 30
# model.params per size; 1b is the shipped config as it is.
SIZES = {
    "1b": None,
    # model.params replaced whole: no recomputation, so the plan of full activations is
    # measured too
    "300m": "model.params={width: 1024, num_layers: 24, num_heads: 16, mlp_width: 4096}",
    "100m": "model.params={width: 768, num_layers: 12, num_heads: 12, mlp_width: 3072}",
}
CONVERT = ["convert", "--pipeline=text", "--output=data/lm_1b",
           "--pipeline_options=sequence_length=128,tokenizer=sentencepiece,vocab_size=1024"]
CHECK = ["check", "--config=lm_1b", "--target=cpu"]
TRAIN = ["train", "--config=lm_1b", "--model_dir=runs/lm_1b"]
STEPS = "train.steps=2"


def _override(size: str, base: str | None = None) -> list[str]:
    parts = [p for p in (base, SIZES[size]) if p]
    return [f"--params_override={','.join(parts)}"] if parts else []


def measure(size: str, work: str) -> dict:
    """Plans and runs one size in `work` (the data converted there on the first size)."""
    shutil.rmtree(os.path.join(work, "runs"), ignore_errors=True)
    if not os.path.exists(os.path.join(work, "data/lm_1b/dataset.json")):
        run_measured([TFTRAIN, *CONVERT], cwd=work)
    plan_path = os.path.join(work, f"plan-{size}.json")
    check_s, _ = run_measured([TFTRAIN, *CHECK, f"--json={plan_path}", *_override(size)],
                              cwd=work, ok_codes=(0, 1))
    with open(plan_path) as f:
        plan = json.load(f)["memory"]
    train_s, peak_mb = run_measured([TFTRAIN, *TRAIN, *_override(size, STEPS)], cwd=work)
    with open(os.path.join(work, "runs/lm_1b/summary.json")) as f:
        summary = json.load(f)
    return {"size": size, "plan": plan, "summary": summary, "peak": peak_mb * (1 << 20),
            "check_s": check_s, "train_s": train_s}


def row(result: dict) -> list:
    """One line of the table."""
    plan, summary = result["plan"], result["summary"]
    parts = plan["parts"]
    planned = plan["bytes_per_device"]
    return [result["size"], f"{summary['parameters']:,}",
            f"{parts['weights'] / GIB:.2f}", f"{parts['gradients'] / GIB:.2f}",
            f"{parts['optimizer_state'] / GIB:.3f}", f"{parts['activations'] / GIB:.2f}",
            f"{planned / GIB:.2f}", f"{result['peak'] / GIB:.2f}",
            f"{planned / result['peak']:.2f}",
            "fits" if plan["fits"] else "does not fit",
            f"{summary['seconds_per_step']:.1f}", f"{result['check_s']:.0f}",
            f"{result['train_s']:.0f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1b,300m")
    parser.add_argument("--workdir", default="/tmp/tftrain-bench-big-model")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores", flush=True)
    rows = []
    for size in args.sizes.split(","):
        print(f"  {size} ...", flush=True)
        rows.append(row(measure(size, args.workdir)))
        print("   ", rows[-1], flush=True)
    print(markdown_table(
        ["size", "parameters", "weights GiB", "gradients GiB", "optimizer GiB",
         "activations GiB", "planned GiB", "measured peak GiB", "planned/measured",
         "check says", "s/step", "check s", "train s"], rows))


if __name__ == "__main__":
    main()

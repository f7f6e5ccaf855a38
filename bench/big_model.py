"""A billion parameters on this machine: lm_1b's memory plan against what its run measures.

    .venv/bin/python bench/big_model.py [--sizes=1b,300m] [--workdir=/tmp/tftrain-bench-big-model]

Run by hand (minutes per size, ~10 GB of memory and of disk for 1b), not by the test suite,
which runs the same commands on a model of a few million parameters. For each size, in a fresh
working directory, the commands of configs/lm_1b.yaml's header as a user types them (`1b`:
exactly; a smaller size adds its `model.params` to the override):

    tftrain convert --pipeline=text --output=data/lm_1b --pipeline_options=...   (first size)
    tftrain check --config=lm_1b --target=cpu --json=plan.json
    tftrain train --config=lm_1b --model_dir=runs/lm_1b --params_override=train.steps=2

then the run's life after training, each command timed and measured the same way (a second
table: exit code, seconds, peak; for quantize the .tflite's size and the perplexity change, or
the line that refused it):

    tftrain generate --model_dir=runs/lm_1b --prompt="The " --max_tokens=8 --seed=1
    tftrain evaluate --model=runs/lm_1b/export --data=data/lm_1b --split=test --steps=1
    tftrain quantize --model_dir=runs/lm_1b --mode=dynamic --steps=1
    tftrain quantize --model_dir=runs/lm_1b --mode=float16 --steps=1

Exit 2 is a result here: quantize refuses, before converting, a mode whose .tflite would exceed
LiteRT's 2 GiB or a conversion its memory estimate (tftrain/optimize/quantize.py) says this
machine cannot hold; the table gives the line it printed.

The plan's bytes per device (by part) come from plan.json. The run's peak memory is the peak of
the summed anonymous PSS of its process tree, sampled every 20 ms (bench/big_data.py's
`run_measured`: the page cache of the data and of the TensorFlow library is not the run's),
over the whole command (build, steps, evaluation, export); seconds per step and the parameter count come from summary.json. Prints
the CPU and two tables; planned/measured within 0.7-1.3 is the bound the plan promises.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.big_data import TFTRAIN, run_measured, run_measured_result  # noqa: E402
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
    # a quick check of the bench itself (and quantize's memory fit: tftrain/optimize/quantize.py)
    "25m": "model.params={width: 512, num_layers: 6, num_heads: 8, mlp_width: 2048, remat: true}",
}
CONVERT = ["convert", "--pipeline=text", "--output=data/lm_1b",
           "--pipeline_options=sequence_length=128,tokenizer=sentencepiece,vocab_size=1024"]
CHECK = ["check", "--config=lm_1b", "--target=cpu"]
TRAIN = ["train", "--config=lm_1b", "--model_dir=runs/lm_1b"]
STEPS = "train.steps=2"
# After training, as configs/lm_1b.yaml's header types them: (name, arguments, exit codes that
# are results: a quantization gate that fails is 1, a mode refused before converting is 2).
AFTER = (
    ("generate", ["generate", "--model_dir=runs/lm_1b", "--prompt=The ", "--max_tokens=8",
                  "--seed=1"], (0,)),
    ("evaluate", ["evaluate", "--model=runs/lm_1b/export", "--data=data/lm_1b", "--split=test",
                  "--steps=1"], (0,)),
    ("quantize dynamic", ["quantize", "--model_dir=runs/lm_1b", "--mode=dynamic", "--steps=1"],
     (0, 1, 2)),
    ("quantize float16", ["quantize", "--model_dir=runs/lm_1b", "--mode=float16", "--steps=1"],
     (0, 1, 2)),
)


def _override(size: str, base: str | None = None) -> list[str]:
    parts = [p for p in (base, SIZES[size]) if p]
    return [f"--params_override={','.join(parts)}"] if parts else []


def open_workdir(work: str) -> None:
    """Prints the CPU, and converts lm_1b's data into `work`/data/lm_1b (its header's command)
    unless it is there: the start of each bench on lm_1b's data."""
    os.makedirs(work, exist_ok=True)
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores", flush=True)
    if not os.path.exists(os.path.join(work, "data/lm_1b/dataset.json")):
        run_measured([TFTRAIN, *CONVERT], cwd=work)


def remove_output(path: str, within: str) -> None:
    """Removes `path` (a run, or a folder of one) when tftrain wrote it: never through a link,
    never out of `within`; a folder of that name from elsewhere stops the bench."""
    from tftrain import run_dir  # imports TensorFlow: not for --help
    from tftrain.fileio import remove

    run_dir.check_replaceable(path)
    remove(path, within=within)


def measure(size: str, work: str) -> dict:
    """Plans and runs one size in `work`, whose data `open_workdir` converted."""
    remove_output(os.path.join(work, "runs/lm_1b"), work)
    plan_path = os.path.join(work, f"plan-{size}.json")
    check_s, _ = run_measured([TFTRAIN, *CHECK, f"--json={plan_path}", *_override(size)],
                              cwd=work, ok_codes=(0, 1))
    with open(plan_path) as f:
        plan = json.load(f)["memory"]
    train_s, peak_mb = run_measured([TFTRAIN, *TRAIN, *_override(size, STEPS)], cwd=work)
    with open(os.path.join(work, "runs/lm_1b/summary.json")) as f:
        summary = json.load(f)
    return {"size": size, "plan": plan, "summary": summary, "peak": peak_mb * (1 << 20),
            "check_s": check_s, "train_s": train_s, "after": after_training(work)}


def after_training(work: str) -> list[dict]:
    """Runs each of AFTER on the run just trained in `work`; per command its exit code, seconds,
    peak bytes and, for quantize, its report (None when refused) or the line it ended with."""
    results = []
    for name, arguments, ok_codes in AFTER:
        result = run_measured_result([TFTRAIN, *arguments], cwd=work, ok_codes=ok_codes)
        report = None
        if arguments[0] == "quantize" and result["returncode"] in (0, 1):
            mode = arguments[2].removeprefix("--mode=")
            with open(os.path.join(work, f"runs/lm_1b/quantized/report_{mode}.json")) as f:
                report = json.load(f)
        lines = result["stderr"].strip().splitlines()
        results.append({"command": name, "returncode": result["returncode"],
                        "seconds": result["seconds"], "peak": result["peak_mb"] * (1 << 20),
                        "report": report,
                        "line": lines[-1] if result["returncode"] and lines else ""})
    return results


def after_rows(result: dict) -> list[list]:
    """The lines of the second table for one size."""
    rows = []
    for entry in result["after"]:
        report = entry["report"] or {}
        tflite = (f"{report['tflite_bytes'] / GIB:.3f}" if report else "-")
        change = (f"{report['metric_change']:+.4f} (vs {report['reference']})" if report
                  else "-")
        rows.append([result["size"], entry["command"], entry["returncode"],
                     f"{entry['seconds']:.0f}", f"{entry['peak'] / GIB:.2f}", tflite, change,
                     entry["line"]])
    return rows


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
    open_workdir(args.workdir)
    rows, after = [], []
    for size in args.sizes.split(","):
        print(f"  {size} ...", flush=True)
        result = measure(size, args.workdir)
        rows.append(row(result))
        after += after_rows(result)
        for line in [rows[-1], *after_rows(result)]:
            print("   ", line, flush=True)
    print(markdown_table(
        ["size", "parameters", "weights GiB", "gradients GiB", "optimizer GiB",
         "activations GiB", "planned GiB", "measured peak GiB", "planned/measured",
         "check says", "s/step", "check s", "train s"], rows))
    print()
    print(markdown_table(
        ["size", "command", "exit", "seconds", "peak GiB", ".tflite GiB", "perplexity change",
         "refused / failed with"], after))


if __name__ == "__main__":
    main()

"""Peak memory and CPU time of `tftrain quantize --steps=1` on large language models: the numbers
behind the memory estimate in tftrain/optimize/quantize.py (MEMORY_FIXED, MEMORY_PER_WEIGHT_BYTE).

    .venv/bin/python bench/quantize_memory.py [--layers=2,6] [--modes=dynamic,float16,int8]
        [--references=keras,tflite] [--workdir=/tmp/tftrain-bench-quantize]

Run by hand (~20 minutes, up to ~10 GB of memory and ~6 GB of disk), not by the test suite. In
--workdir: lm_1b's data, converted by the command of configs/lm_1b.yaml's header, then per
number of layers a transformer_lm of lm_1b's blocks (width 2048, MLP 8192, 16 heads;
2 layers: 105M weights, 6: 307M) trained for one step (`tftrain train --config=lm_1b
--params_override=model.params={...},train.steps=1`), then `tftrain quantize --mode=M
--steps=1` once per mode and float reference. `keras`: LiteRT's flatbuffer limit is lowered in
the quantize process to 3 bytes a weight, so the float .tflite is over it and the float32 Keras
model is the reference, as for a model over 537M weights; `tflite`: as shipped, the float
.tflite is converted and measured too. A run's quantized/ is removed after each command.

Memory: the peak of the summed anonymous PSS of the command's process tree, sampled every 20 ms
(bench/big_data.py's `run_measured_result`); CPU: user + system seconds of the command.
Prints the CPU, one line per command and, per mode and reference, the line through the two
smallest sizes: k = the peak's growth per float32 weight byte, and the fixed part.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.big_data import TFTRAIN, run_measured_result  # noqa: E402
from bench.big_model import open_workdir, remove_output  # noqa: E402
from bench.table import markdown_table  # noqa: E402

MIB = 1 << 20
BLOCKS = "width: 2048, num_heads: 16, mlp_width: 8192, remat: true"
# `tftrain quantize` with LiteRT's limit lowered to argv[1] bytes (its other arguments follow).
LOWERED = ("import sys; from tftrain.optimize import quantize; "
           "quantize.FLATBUFFER_LIMIT = int(sys.argv[1]); from tftrain.cli import run; "
           "run(['tftrain', *sys.argv[2:]])")


def train(work: str, layers: int) -> str:
    """The run of `layers` blocks in `work` (trained once; reused when its export exists)."""
    run = f"runs/lm_{layers}l"
    if not os.path.exists(os.path.join(work, run, "summary.json")):
        override = (f"--params_override=model.params={{num_layers: {layers}, {BLOCKS}}},"
                    "train.steps=1")
        run_measured_result([TFTRAIN, "train", "--config=lm_1b", f"--model_dir={run}",
                             "--overwrite", override], cwd=work)
    return run


def quantize(work: str, run: str, mode: str, reference: str) -> dict:
    """One measured `tftrain quantize --mode=mode --steps=1` of `run` against `reference`."""
    from tftrain import run_dir  # imports TensorFlow: not for --help

    with open(os.path.join(work, run, "summary.json")) as f:
        weights = json.load(f)["parameters"]
    arguments = ["quantize", f"--model_dir={run}", f"--mode={mode}", "--steps=1",
                 "--max_metric_change=100"]
    command = ([TFTRAIN, *arguments] if reference == "tflite"
               else [sys.executable, "-c", LOWERED, str(3 * weights), *arguments])
    quantized = os.path.join(work, run, run_dir.QUANTIZED)
    remove_output(quantized, os.path.join(work, run))
    result = run_measured_result(command, cwd=work, ok_codes=(0, 1))
    with open(os.path.join(quantized, f"report_{mode}.json")) as f:
        report = json.load(f)
    remove_output(quantized, os.path.join(work, run))  # its .tflite files: gigabytes of disk
    assert report["reference"] == reference, report["reference"]
    return {"run": run, "weights": weights, "mode": mode, "reference": reference,
            "peak_mib": result["peak_mb"], "seconds": result["seconds"],
            "cpu_seconds": result["cpu_seconds"], "change": report["metric_change"]}


def fit(results: list[dict]) -> list[list]:
    """Per mode and reference, the line through the two smallest models: k per float32 weight
    byte and the fixed MiB."""
    rows = []
    for key in sorted({(r["mode"], r["reference"]) for r in results}):
        points = sorted((r["weights"] * 4, r["peak_mib"] * MIB) for r in results
                        if (r["mode"], r["reference"]) == key)
        if len(points) < 2:
            continue
        (x0, y0), (x1, y1) = points[:2]
        k = (y1 - y0) / (x1 - x0)
        rows.append([*key, f"{k:.2f}", f"{(y0 - k * x0) / MIB:.0f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="2,6")
    parser.add_argument("--modes", default="dynamic,float16,int8")
    parser.add_argument("--references", default="keras,tflite")
    parser.add_argument("--workdir", default="/tmp/tftrain-bench-quantize")
    args = parser.parse_args()
    open_workdir(args.workdir)
    results = []
    for layers in [int(n) for n in args.layers.split(",")]:
        run = train(args.workdir, layers)
        for reference in args.references.split(","):
            for mode in args.modes.split(","):
                results.append(quantize(args.workdir, run, mode, reference))
                print("   ", json.dumps(results[-1]), flush=True)
    print(markdown_table(
        ["run", "weights", "mode", "reference", "peak MiB", "seconds", "CPU s",
         "perplexity change"],
        [[r["run"], f"{r['weights']:,}", r["mode"], r["reference"], f"{r['peak_mib']:.0f}",
          f"{r['seconds']:.0f}", f"{r['cpu_seconds']:.0f}", f"{r['change']:+.4f}"]
         for r in results]))
    print()
    print(markdown_table(["mode", "reference", "k (x float32 weight bytes)", "fixed MiB"],
                         fit(results)))


if __name__ == "__main__":
    main()

"""Multi-worker scaling on loopback: examples/s of 1 worker vs 2 workers, each pinned to one core.

    python bench/scale.py [--epochs=3] [--per_worker_batch=64] [--images=8000] [--workdir=DIR]

Both runs go through the real path, `tftrain launch --pin_cpus --num_workers=N -- train ...`
(worker i pinned to core i), with the per-worker batch held fixed (weak scaling: the global
batch is per_worker_batch x N, as in any data-parallel scale-out). Throughput is the steady-state
examples/s of summary.json (epochs after the first; validation not counted).
Workloads: the digits CNN (8x8x1, 1.4k training images, small steps: communication-bound) and
a larger generated image set (bench/synthetic.py: 32x32x3 PNG records, a wider CNN).
Scaling efficiency = speedup / N. The machine is shared: the load average is printed with each
run, and a busy neighbour on the second core shows up directly in the 2-worker numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

TFTRAIN = [sys.executable, "-c", "import sys; from tftrain.cli import run; run(['tftrain'] + sys.argv[1:])"]

# The rows of the table, as docs/benchmarks.md shows them.
DIGITS = "digits CNN (8×8×1)"
IMAGES = "generated images (32×32×3, CNN 64-128)"
WORKLOADS = {
    DIGITS: {
        "config": "digits",
        "overrides": "model.params={filters: [32, 64], dense_units: 128, dropout: 0.25}",
    },
    IMAGES: {
        "config": "digits",
        "overrides": "data.pipeline=bench.synthetic,"
                     "model.params={filters: [64, 128], dense_units: 128, dropout: 0.25}",
        "synthetic": True,
    },
}


def load_average() -> str:
    """The 1-minute load average of the machine, e.g. '1.9 (2 cores)'."""
    return f"{os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)"


def run_launch(workdir: str, name: str, workload: dict, workers: int, args) -> dict:
    """One `tftrain launch --pin_cpus` run; returns its summary.json plus timing notes."""
    model_dir = os.path.join(workdir, f"{name.split()[0]}-{workers}w-{time.monotonic_ns()}")
    overrides = ",".join([
        workload["overrides"], f"data.dir={workload['data_dir']}",
        f"data.batch_size={args.per_worker_batch * workers}", f"train.epochs={args.epochs}",
        f"train.steps_per_execution={args.steps_per_execution}"])
    command = TFTRAIN + ["launch", f"--num_workers={workers}", "--pin_cpus", f"--timeout={args.timeout}",
                         "--", "train", f"--config={workload['config']}", f"--model_dir={model_dir}",
                         f"--params_override={overrides}"]
    load_before = load_average()
    started = time.monotonic()
    result = subprocess.run(command, cwd=workdir, env={**os.environ, "PYTHONPATH": REPO},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-30:])
        raise SystemExit(f"launch of {workers} worker(s) for {name} failed ({result.returncode}):\n{tail}")
    with open(os.path.join(model_dir, "summary.json")) as f:
        summary = json.load(f)
    summary["wall_seconds"] = time.monotonic() - started
    summary["load"] = f"{load_before} -> {load_average()}"
    return summary


def run_independent_pair(workdir: str, name: str, workload: dict, args) -> float:
    """Two separate 1-worker trainings at once, one per core, no communication: the summed
    examples/s is what this machine's two cores deliver together right now (the ceiling for 2
    workers; below 2x the 1-worker rate when the cores are shared or throttled)."""
    processes = []
    for core in (0, 1):
        model_dir = os.path.join(workdir, f"{name.split()[0]}-solo{core}-{time.monotonic_ns()}")
        overrides = ",".join([
            workload["overrides"], f"data.dir={workload['data_dir']}",
            f"data.batch_size={args.per_worker_batch}", f"train.epochs={args.epochs}",
            f"train.steps_per_execution={args.steps_per_execution}"])
        command = TFTRAIN + ["train", f"--config={workload['config']}", f"--model_dir={model_dir}",
                             f"--params_override={overrides}"]
        processes.append((model_dir, subprocess.Popen(
            command, cwd=workdir, env={**os.environ, "PYTHONPATH": REPO},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda core=core: os.sched_setaffinity(0, {core}))))
    total = 0.0
    for model_dir, process in processes:
        if process.wait(args.timeout) != 0:
            raise SystemExit(f"independent run in {model_dir} failed")
        with open(os.path.join(model_dir, "summary.json")) as f:
            total += json.load(f)["examples_per_second"]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (the first is not timed)")
    parser.add_argument("--per_worker_batch", type=int, default=64)
    parser.add_argument("--images", type=int, default=8000, help="size of the generated image set")
    parser.add_argument("--steps_per_execution", type=int, default=10,
                        help="train.steps_per_execution (1: per-step host overhead dominates digits)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--workdir", default=None, help="default: a temporary directory")
    parser.add_argument("--only", default=None, choices=["digits", "synthetic"],
                        help="run one workload: digits or synthetic")
    args = parser.parse_args()

    workdir = args.workdir or tempfile.mkdtemp(prefix="tftrain-scale-")
    os.makedirs(workdir, exist_ok=True)
    import tftrain  # noqa: F401  (tf-keras before TensorFlow)
    from bench import synthetic
    from bench.table import markdown_table, ms
    from pipelines import load_pipeline
    from tftrain.data import manifest as manifest_lib
    from tftrain.data.writer import write_dataset

    digits_dir = os.path.join(workdir, "digits")
    if not manifest_lib.exists(digits_dir):  # 2 shards: each worker reads its own file
        write_dataset(load_pipeline("digits"), "", digits_dir, num_shards=2)
    WORKLOADS[DIGITS]["data_dir"] = digits_dir
    images_dir = os.path.join(workdir, f"synthetic-{args.images}")
    synthetic.make_dataset(images_dir, count=args.images, num_shards=8)
    WORKLOADS[IMAGES]["data_dir"] = images_dir

    rows = []
    for name, workload in WORKLOADS.items():
        if args.only and name != {"digits": DIGITS, "synthetic": IMAGES}[args.only]:
            continue
        one = run_launch(workdir, name, workload, 1, args)
        two = run_launch(workdir, name, workload, 2, args)
        pair = run_independent_pair(workdir, name, workload, args)
        speedup = two["examples_per_second"] / one["examples_per_second"]
        rows.append((name, one, two, speedup, pair))
        print(f"{name}: 1 worker {one['examples_per_second']:.0f} ex/s (load {one['load']}), "
              f"2 workers {two['examples_per_second']:.0f} ex/s (load {two['load']}), "
              f"2 independent runs {pair:.0f} ex/s", flush=True)

    print()
    print(f"per-worker batch {args.per_worker_batch}, {args.epochs} epochs (first not timed), "
          f"steps_per_execution {args.steps_per_execution}, each worker pinned to one core; "
          f"load average now {load_average()}\n")
    table = []
    for name, one, two, speedup, pair in rows:
        table.append([name, f"{one['examples_per_second']:,.0f}",
                      f"{two['examples_per_second']:,.0f}", f"{speedup:.2f}x",
                      f"{pair / one['examples_per_second']:.2f}x",
                      f"{ms(one['seconds_per_step'] * 1e3)} / {ms(two['seconds_per_step'] * 1e3)}"])
    print(markdown_table(["workload", "1 worker ex/s", "2 workers ex/s", "speedup", "ceiling",
                          "ms/step 1w / 2w"], table))
    print("\nspeedup = 2 workers / 1 worker; ceiling = 2 independent 1-worker runs at once "
          "(one per core, no communication) / 1 worker; target: >= 1.6x with 2 workers on the "
          "image set")


if __name__ == "__main__":
    main()

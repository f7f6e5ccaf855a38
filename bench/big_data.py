"""Memory at scale: peak memory of `tftrain convert`, `tftrain inspect --verify` (every record
parsed and its content checked) and a training run at three corpus sizes, for every kind of raw
data (jsonl, text, csv, numpy, image folders).

    .venv/bin/python bench/big_data.py [--sizes_mb=32,128,512] [--kinds=jsonl,text,csv,numpy,images]
                                       [--workdir=/tmp/tftrain-bench-big]

Data (generated once into --workdir, at each size): jsonl text classification (words drawn from
a 50,000-word Zipf vocabulary, so the vocabulary pass has real work), plain text for the
character language model, a numeric CSV (16 features, a float label), NumPy arrays (float32
[rows, 256], int labels) and a folder of 64x64 noise PNGs in 10 classes (hard links of one
generated set under new names, so the bytes on disk are the size asked for).
`--beyond_ram`: instead, once, an image folder of 256x256 noise PNGs larger than this machine's
memory (1.1x MemTotal), converted and read for one whole training pass (`train.epochs=1`).

Each size is converted with the command a user types (`tftrain convert --pipeline=...`, 2
workers) and trained with `tftrain train` for 100 steps with bounded evaluation
(`train.validation_steps=5,train.test_steps=5`). Memory: the peak of the summed anonymous PSS of
the command's process tree (bench/convert.py's measure: the page cache of the data and of mapped
files is not the command's), sampled every 20 ms. Prints the table and, per kind and command,
largest/smallest: flat memory is ~1.0x (the bound is 1.2x).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.convert import process_memory, process_tree  # noqa: E402
from bench.table import markdown_table  # noqa: E402
from tftrain.host import cpu_name  # noqa: E402

TFTRAIN = os.path.join(os.path.dirname(sys.executable), "tftrain")
KINDS = ("jsonl", "text", "csv", "numpy", "images")
PIPELINES = {"jsonl": "jsonl", "text": "text", "csv": "csv", "numpy": "numpy",
             "images": "image_folder"}
# How each kind trains: a shipped config, and overrides that fit it to the bench's data.
TRAINING = {
    "jsonl": ("text_classification", ""),
    "text": ("text_lm", ""),
    "csv": ("diabetes", ""),
    "numpy": ("digits", "model.name=mlp,model.params={hidden_units: [64]}"),
    "images": ("digits", "model.name=cnn"),
}
STEPS = "train.steps=100,train.validation_steps=5,train.test_steps=5,data.shuffle_buffer=1000"
WORDS = 50_000


# ---- data ------------------------------------------------------------------------------------

def _words(rng):
    import numpy as np

    ranks = np.arange(1, WORDS + 1)
    weights = 1.0 / ranks
    return [f"w{i}" for i in range(WORDS)], weights / weights.sum()


def _write_until(path: str, size: int, chunk) -> None:
    """Writes `chunk()` (text) to `path` until it holds `size` bytes."""
    written = 0
    with open(path, "w") as f:
        while written < size:
            text = chunk()
            f.write(text)
            written += len(text)


def make_jsonl(path: str, size: int) -> None:
    """`size` bytes of {"text": ..., "label": ...} lines, 40 Zipf words each, 4 classes."""
    import numpy as np

    rng = np.random.default_rng(0)
    words, weights = _words(rng)

    def chunk() -> str:
        ids = rng.choice(WORDS, (1000, 40), p=weights)
        return "".join(json.dumps({"text": " ".join(words[i] for i in row),
                                   "label": int(row[0] % 4)}) + "\n" for row in ids)

    _write_until(path, size, chunk)


def make_text(path: str, size: int) -> None:
    """`size` bytes of plain text lines of Zipf words."""
    import numpy as np

    rng = np.random.default_rng(1)
    words, weights = _words(rng)
    _write_until(path, size, lambda: "".join(
        " ".join(words[i] for i in row) + "\n"
        for row in rng.choice(WORDS, (1000, 16), p=weights)))


def make_csv(path: str, size: int) -> None:
    """`size` bytes of 16 float features and a float label."""
    import numpy as np

    rng = np.random.default_rng(2)
    header = [",".join(f"f{i}" for i in range(16)) + ",label\n"]

    def chunk() -> str:
        x = rng.normal(size=(2000, 16))
        rows = "".join(",".join(f"{v:.5f}" for v in row) + f",{t:.5f}\n"
                       for row, t in zip(x, x[:, :4].sum(axis=1)))
        return (header.pop() if header else "") + rows

    _write_until(path, size, chunk)


def make_numpy(folder: str, size: int) -> None:
    """x.npy (float32 [rows, 256]) and y.npy (int64 labels in 10 classes) of `size` bytes."""
    import numpy as np

    os.makedirs(folder, exist_ok=True)
    rows = max(1000, size // (256 * 4))
    rng = np.random.default_rng(3)
    x = np.lib.format.open_memmap(os.path.join(folder, "x.npy"), "w+", np.float32, (rows, 256))
    for start in range(0, rows, 20_000):
        stop = min(rows, start + 20_000)
        x[start:stop] = rng.random((stop - start, 256), dtype=np.float32)
    x.flush()
    del x
    np.save(os.path.join(folder, "y.npy"), rng.integers(0, 10, rows))


def make_images(folder: str, size: int, base: str) -> None:
    """Hard links of the PNGs in `base` under new names, until `size` bytes."""
    from bench.convert import make_images as generate

    generate(base, 2000)
    files = [(label, name) for label in sorted(os.listdir(base)) if not label.startswith(".")
             for name in sorted(os.listdir(os.path.join(base, label)))]
    written, copy = 0, 0
    while written < size:
        for label, name in files:
            os.makedirs(os.path.join(folder, label), exist_ok=True)
            source = os.path.join(base, label, name)
            os.link(source, os.path.join(folder, label, f"{copy}-{name}"))
            written += os.path.getsize(source)
            if written >= size:
                break
        copy += 1


def memory_total() -> int:
    """This machine's memory in bytes (MemTotal)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no MemTotal in /proc/meminfo")


def make_large_pngs(base: str, count: int = 400) -> None:
    """`count` 256x256 RGB noise PNGs (~197 KB each: noise does not compress) in 10 classes."""
    import numpy as np
    from PIL import Image

    if os.path.exists(os.path.join(base, ".done")):
        return
    rng = np.random.default_rng(4)
    for index in range(count):
        folder = os.path.join(base, f"class{index % 10}")
        os.makedirs(folder, exist_ok=True)
        pixels = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"{index:04d}.png"))
    open(os.path.join(base, ".done"), "w").close()


def beyond_ram(work: str) -> None:
    """Converts and trains one pass over an image folder of 1.1x this machine's memory."""
    size = int(1.1 * memory_total())
    base = os.path.join(work, "src", "large-png-base")
    source = os.path.join(work, "src", f"images-beyond-ram-{size >> 30}g")
    make_large_pngs(base)
    if not os.path.exists(source + ".done"):
        print(f"  linking {size / 2**30:.1f} GB of PNGs ...", flush=True)
        make_images(source, size, base)
        open(source + ".done", "w").close()
    out = os.path.join(work, "out-beyond-ram")
    convert_s, convert_mb = run_measured(
        [TFTRAIN, "convert", "--pipeline=image_folder", f"--input={source}", f"--output={out}",
         "--workers=2", "--overwrite",
         "--pipeline_options=image_size=64x64,image_encoding=keep"])  # stored as they are
    with open(os.path.join(out, "dataset.json")) as f:
        manifest = json.load(f)
    stored = sum(s["bytes"] for split in manifest["splits"].values() for s in split["shards"])
    train_s, train_mb = run_measured(
        [TFTRAIN, "train", "--config=digits", f"--model_dir={os.path.join(work, 'run-big')}",
         "--overwrite", f"--params_override=data.dir={out},data.pipeline=image_folder,"
         "train.epochs=1,train.validation_steps=20,train.test_steps=20,"
         "data.shuffle_buffer=2000,data.batch_size=128,model.params={filters: [16], "
         "dense_units: 32}"])
    with open(os.path.join(work, "run-big", "summary.json")) as f:
        summary = json.load(f)
    print(markdown_table(
        ["machine memory", "dataset (TFRecords)", "examples trained", "convert", "convert peak",
         "one training pass", "train peak"],
        [[f"{memory_total() / 2**30:.1f} GB", f"{stored / 2**30:.1f} GB",
          f"{summary['steps'] * 128:,}", f"{convert_s / 60:.1f} min", f"{convert_mb:,.0f} MB",
          f"{train_s / 60:.1f} min", f"{train_mb:,.0f} MB"]]))


def make(kind: str, work: str, size_mb: int) -> str:
    """The source of `kind` at `size_mb`, generated once; returns its path."""
    size = size_mb << 20
    path = os.path.join(work, "src", f"{kind}-{size_mb}")
    done = path + ".done"
    if os.path.exists(done):
        return path + {"jsonl": ".jsonl", "text": ".txt", "csv": ".csv"}.get(kind, "")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    print(f"  generating {kind} {size_mb} MB ...", flush=True)
    if kind == "jsonl":
        make_jsonl(path + ".jsonl", size)
    elif kind == "text":
        make_text(path + ".txt", size)
    elif kind == "csv":
        make_csv(path + ".csv", size)
    elif kind == "numpy":
        make_numpy(path, size)
    else:
        make_images(path, size, os.path.join(work, "src", "images-base"))
    open(done, "w").close()
    return make(kind, work, size_mb)


# ---- measuring -------------------------------------------------------------------------------

def run_measured(command: list[str], cwd: str = REPO,
                 ok_codes: tuple = (0,)) -> tuple[float, float]:
    """Runs `command` in `cwd`; returns (seconds, peak MB of its process tree's anonymous
    memory). An exit code outside `ok_codes` ends the bench with the command's error."""
    result = run_measured_result(command, cwd, ok_codes)
    return result["seconds"], result["peak_mb"]


def run_measured_result(command: list[str], cwd: str = REPO, ok_codes: tuple = (0,)) -> dict:
    """`run_measured` with what the command said: `{"seconds", "cpu_seconds", "peak_mb",
    "returncode", "stdout", "stderr"}` (`cpu_seconds`: user + system of the command and the
    processes it waited for)."""
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, cwd=cwd)
    peak, done = 0, threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, sum(process_memory(p) for p in process_tree(process.pid)))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = process.communicate()
    done.set()
    sampler.join()
    if process.returncode not in ok_codes:
        raise SystemExit(f"{' '.join(command)} failed:\n{stderr[-3000:]}")
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = used.ru_utime + used.ru_stime - children.ru_utime - children.ru_stime
    return {"seconds": time.perf_counter() - started, "cpu_seconds": cpu,
            "peak_mb": peak / 2**20, "returncode": process.returncode, "stdout": stdout,
            "stderr": stderr}


def measure(kind: str, source: str, work: str, size_mb: int) -> dict:
    """Converts `source` and trains on it; the seconds and peak memory of each."""
    import shutil

    out = os.path.join(work, "out", f"{kind}-{size_mb}")
    shutil.rmtree(os.path.join(work, "out"), ignore_errors=True)
    convert_s, convert_mb = run_measured(
        [TFTRAIN, "convert", f"--pipeline={PIPELINES[kind]}", f"--input={source}",
         f"--output={out}", "--workers=2"])
    with open(os.path.join(out, "dataset.json")) as f:
        examples = sum(s["num_examples"] for s in json.load(f)["splits"].values())
    verify_s, verify_mb = run_measured([TFTRAIN, "inspect", f"--data={out}", "--verify"])
    config, overrides = TRAINING[kind]
    run = os.path.join(work, "out", "run")
    train_s, train_mb = run_measured(
        [TFTRAIN, "train", f"--config={config}", f"--model_dir={run}", "--overwrite",
         f"--params_override=data.dir={out},data.pipeline={PIPELINES[kind]},{STEPS}"
         + (f",{overrides}" if overrides else "")])
    shutil.rmtree(os.path.join(work, "out"), ignore_errors=True)
    return {"examples": examples, "convert_s": convert_s, "convert_mb": convert_mb,
            "verify_s": verify_s, "verify_mb": verify_mb, "train_s": train_s,
            "train_mb": train_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes_mb", default="32,128,512")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--workdir", default="/tmp/tftrain-bench-big")
    parser.add_argument("--beyond_ram", action="store_true",
                        help="once: an image folder larger than this machine's memory")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    kinds = [k for k in args.kinds.split(",") if k]
    if set(kinds) - set(KINDS) or len(sizes) < 2:
        parser.error(f"--kinds: a subset of {','.join(KINDS)}; --sizes_mb: two sizes or more")
    work = os.path.abspath(args.workdir)
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores", flush=True)
    if args.beyond_ram:
        beyond_ram(work)
        return
    rows, ratios = [], []
    for kind in kinds:
        results = {}
        for size in sizes:
            source = make(kind, work, size)
            print(f"  {kind} {size} MB ...", end=" ", flush=True)
            results[size] = measure(kind, source, work, size)
            r = results[size]
            print(f"convert {r['convert_s']:.0f}s {r['convert_mb']:.0f} MB, verify "
                  f"{r['verify_s']:.0f}s {r['verify_mb']:.0f} MB, train "
                  f"{r['train_s']:.0f}s {r['train_mb']:.0f} MB", flush=True)
            rows.append([kind, f"{size:,}", f"{r['examples']:,}", f"{r['convert_mb']:,.0f}",
                         f"{r['verify_mb']:,.0f}", f"{r['train_mb']:,.0f}",
                         f"{r['convert_s']:.0f}", f"{r['examples'] / r['verify_s']:,.0f}",
                         f"{r['train_s']:.0f}"])
        small, large = results[sizes[0]], results[sizes[-1]]
        ratios.append([kind, f"{sizes[-1] // sizes[0]}x",
                       f"{large['convert_mb'] / small['convert_mb']:.2f}x",
                       f"{large['verify_mb'] / small['verify_mb']:.2f}x",
                       f"{large['train_mb'] / small['train_mb']:.2f}x"])
    print()
    print(markdown_table(["data", "MB of source", "examples", "convert peak MB",
                          "inspect --verify peak MB", "train peak MB", "convert s",
                          "verify records/s", "train s"], rows,
                         ["l", "r", "r", "r", "r", "r", "r", "r", "r"]))
    print()
    print(markdown_table(["data", "size, largest/smallest", "convert memory", "verify memory",
                          "train memory"], ratios, ["l", "r", "r", "r", "r"]))
    load = os.getloadavg()
    print(f"\nload average {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f}")


if __name__ == "__main__":
    main()

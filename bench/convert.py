"""Conversion speed and memory: tftrain's writer against a naive loop and Model Garden's writer.

    .venv/bin/python bench/convert.py [--images=6000] [--rows=10000] [--repeats=3] [--workdir=...]
                                      [--kinds=images,arrays]

Data (generated once into --workdir): a folder of 64x64 RGB PNGs in 10 classes, and a NumPy set
(x: float32 [rows, 784], y: int labels, as x.npy/y.npy), each at 1x and 4x the size (the 4x image
folder hard-links the 1x files under new names).

Methods, each run in a fresh process that has already imported TensorFlow (the clock covers the
conversion only; tftrain's forkserver is warmed up the way `tftrain convert` starts it):
  naive         one process: PIL open (size) / np row -> tf.train.Example -> one TFRecordWriter
  model_garden  Model Garden's own `official.vision.data.tfrecord_lib.write_tf_record_dataset`
                (tf-models-official, MODEL_GARDEN below), 2 processes, 4 shards: its
                multiprocessing.Pool(2).starmap builds every example in memory, then the parent
                writes them round-robin into shards opened in place under their final names
  model_garden_copy  the same structure re-implemented here (this benchmark's earlier stand-in
                for the library, kept as a check that the library row measures the structure)
  tftrain_w1/2  `tftrain.data.writer.write_dataset` with 1 and 2 worker processes, 4 shards
Every method builds the same Examples (`image_example`, `array_example`) with the same TensorFlow.
The bench installs Model Garden itself, never into the project's venv: a throwaway venv in
--workdir (created once, with uv) holds tf-models-official and the three packages
`official.vision` imports beyond tftrain's dependencies, all without their own dependencies,
and sees this venv's packages after its own (as tests/test_wheel.py's venv does), so that
tf-models-official's `tensorflow~=2.20` pin does not bring a second TensorFlow.
Each method runs once with memory sampling, then --repeats times for speed, the methods
interleaved, each run after `sync` (so no run pays for writing back the previous run's output);
the table shows each method's fastest run.
Memory: the peak of the summed anonymous PSS (the memory a process really holds: not the page
cache of mapped files or libraries) of the process and all its descendants, sampled every 20 ms.
Prints one table with the ratios and the load average (the machine may be shared).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.table import markdown_table  # noqa: E402
from tftrain.host import cpu_name  # noqa: E402

SIZE, CLASSES, FEATURES = 64, 10, 784
METHODS = ("naive", "model_garden", "model_garden_copy", "tftrain_w1", "tftrain_w2")
# The method column of the table, as docs/benchmarks.md shows it.
MODEL_GARDEN = "tf-models-official==2.20.0"
# What `import official.vision.data.tfrecord_lib` needs beyond tftrain's own dependencies.
MODEL_GARDEN_IMPORTS = ("gin-config==0.5.0", "pycocotools==2.0.11",
                        "opencv-python-headless==5.1.0.95")
METHOD_LABELS = {"naive": "naive loop (one Example at a time → writer)",
                 "model_garden": f"Model Garden's write_tf_record_dataset ({MODEL_GARDEN}, "
                                 "2 processes)",
                 "model_garden_copy": "its structure re-implemented in this script",
                 "tftrain_w1": "tftrain, 1 worker", "tftrain_w2": "tftrain, 2 workers"}


# ---- data ------------------------------------------------------------------------------------

def make_images(root: str, count: int, size: int = SIZE, image_format: str = "png") -> None:
    """`count` size x size RGB images (a class-coloured gradient plus noise; ~10 KB each as
    64x64 PNGs) in 10 class folders, as `image_format` files (png or jpeg)."""
    import numpy as np
    from PIL import Image

    if os.path.exists(os.path.join(root, ".done")):
        return
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 1, size, dtype=np.float32)
    suffix = {"png": "png", "jpeg": "jpg"}[image_format]
    for i in range(count):
        label = i % CLASSES
        folder = os.path.join(root, f"class{label}")
        os.makedirs(folder, exist_ok=True)
        base = np.outer(ramp, ramp)[..., None] * np.array([label * 25, 120, 255 - label * 25])
        pixels = np.clip(base + rng.normal(0, 24, (size, size, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"{i:06d}.{suffix}"))
    open(os.path.join(root, ".done"), "w").close()


def replicate_images(source: str, root: str, times: int) -> None:
    """`times` hard-linked copies of every image of `source` under new names."""
    if os.path.exists(os.path.join(root, ".done")):
        return
    for label in sorted(os.listdir(source)):
        if label.startswith("."):
            continue
        os.makedirs(os.path.join(root, label), exist_ok=True)
        for name in sorted(os.listdir(os.path.join(source, label))):
            for copy in range(times):
                target = os.path.join(root, label, f"{copy}-{name}")
                if not os.path.exists(target):
                    os.link(os.path.join(source, label, name), target)
    open(os.path.join(root, ".done"), "w").close()


def make_arrays(root: str, rows: int) -> None:
    """x.npy (float32 [rows, 784]) and y.npy (int64 labels)."""
    import numpy as np

    if os.path.exists(os.path.join(root, "y.npy")):
        return
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(1)
    x = np.lib.format.open_memmap(os.path.join(root, "x.npy"), "w+", np.float32, (rows, FEATURES))
    for start in range(0, rows, 10_000):
        stop = min(rows, start + 10_000)
        x[start:stop] = rng.random((stop - start, FEATURES), dtype=np.float32)
    x.flush()
    del x
    np.save(os.path.join(root, "y.npy"), rng.integers(0, CLASSES, rows))


# ---- the methods (run inside a child process) ------------------------------------------------

def _image_rows(src: str):
    labels = sorted(n for n in os.listdir(src) if not n.startswith("."))
    for label, name in enumerate(labels):
        for file in sorted(os.listdir(os.path.join(src, name))):
            yield os.path.join(src, name, file), label


def image_example(path: str, label: int):
    """PIL open for the size, the file's bytes, the standard image keys."""
    import tensorflow as tf
    from PIL import Image

    with Image.open(path) as image:
        width, height = image.size
        image_format = image.format.lower()
    with open(path, "rb") as f:
        encoded = f.read()

    def _bytes(v):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))

    def _int(v):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))

    return tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": _bytes(encoded), "image/format": _bytes(image_format.encode()),
        "image/height": _int(height), "image/width": _int(width), "image/class/label": _int(label),
        "image/filename": _bytes(os.path.basename(path).encode())}))


def array_example(x_row, label):
    """A float feature vector and an int label."""
    import tensorflow as tf

    return tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=x_row)),
        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))}))


def _rows(kind: str, src: str):
    if kind == "images":
        yield from _image_rows(src)
    else:
        import numpy as np

        x = np.load(os.path.join(src, "x.npy"), mmap_mode="r")
        y = np.load(os.path.join(src, "y.npy"), mmap_mode="r")
        for i in range(len(y)):
            yield np.asarray(x[i]), int(y[i])


def run_naive(kind: str, src: str, out: str) -> int:
    import tensorflow as tf

    make = image_example if kind == "images" else array_example
    count = 0
    with tf.io.TFRecordWriter(os.path.join(out, "data.tfrecord")) as writer:
        for args in _rows(kind, src):
            writer.write(make(*args).SerializeToString())
            count += 1
    return count


def example_and_none_skipped(kind: str, source, label) -> tuple:
    """Model Garden's `process_func`: (the Example, the number of annotations skipped)."""
    return (image_example if kind == "images" else array_example)(source, label), 0


def run_model_garden(kind: str, src: str, out: str, num_shards: int = 4) -> int:
    """Model Garden's own writer (imported before the clock starts), with 2 processes."""
    from official.vision.data import tfrecord_lib

    rows = [(kind, *row) for row in _rows(kind, src)]
    tfrecord_lib.write_tf_record_dataset(os.path.join(out, "data"), rows,
                                         example_and_none_skipped, num_shards,
                                         multiple_processes=2)
    return len(rows)


def run_model_garden_copy(kind: str, src: str, out: str, num_shards: int = 4) -> int:
    """Model Garden's structure: Pool.starmap materializes all examples, then in-place writes."""
    import multiprocessing

    import tensorflow as tf

    make = image_example if kind == "images" else array_example
    writers = [tf.io.TFRecordWriter(os.path.join(out, f"data-{i:05d}-of-{num_shards:05d}.tfrecord"))
               for i in range(num_shards)]
    with multiprocessing.Pool(2) as pool:
        examples = pool.starmap(make, _rows(kind, src))
    for index, example in enumerate(examples):
        writers[index % num_shards].write(example.SerializeToString())
    for writer in writers:
        writer.close()
    return len(examples)


def run_tftrain(kind: str, src: str, out: str, workers: int) -> int:
    from pipelines import load_pipeline
    from tftrain.data.writer import write_dataset

    pipeline = load_pipeline("image_folder" if kind == "images" else "numpy")
    manifest = write_dataset(pipeline, src, out, workers=workers, num_shards=4,
                             overwrite=True, progress=False)
    return sum(s["num_examples"] for s in manifest["splits"].values())


def child(method: str, kind: str, src: str, out: str) -> None:
    """Runs one method and prints {"seconds", "examples", "bytes"} as JSON."""
    import tftrain  # noqa: F401  (selects tf-keras before TensorFlow is imported)
    import tensorflow as tf  # noqa: F401  (imported before the clock starts, for every method)

    if method == "model_garden":
        from official.vision.data import tfrecord_lib  # noqa: F401  (its imports: not timed)
    if method == "tftrain_w2":
        from tftrain.data import processes

        processes.warm_up()
        warm = processes.context().Process(target=os.getpid)
        warm.start()
        warm.join()  # the forkserver has imported TensorFlow, as by the time `convert` needs it
    os.makedirs(out, exist_ok=True)
    started = time.perf_counter()
    if method == "naive":
        count = run_naive(kind, src, out)
    elif method == "model_garden":
        count = run_model_garden(kind, src, out)
    elif method == "model_garden_copy":
        count = run_model_garden_copy(kind, src, out)
    else:
        count = run_tftrain(kind, src, out, workers=int(method[-1]))
    seconds = time.perf_counter() - started
    nbytes = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out) if ".tfrecord" in n)
    print(json.dumps({"seconds": seconds, "examples": count, "bytes": nbytes}))


# ---- measuring -------------------------------------------------------------------------------

def process_tree(pid: int) -> list[int]:
    pids, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as f:
                kids = [int(p) for p in f.read().split()]
        except OSError:
            kids = []
        pids += kids
        frontier += kids
    return pids


def process_memory(pid: int) -> int:
    """Anonymous + shared-memory PSS of one process in bytes (0 when it is gone).

    File-backed pages (mapped .npy files, the TensorFlow library) are page cache the kernel can
    drop, so they are left out; where PSS is unavailable, RSS stands in.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line and "-" not in line[:12])
        return sum(int(fields[k].split()[0]) for k in ("Pss_Anon", "Pss_Shmem")) * 1024
    except (OSError, KeyError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def model_garden_python(work: str) -> str:
    """The python of the throwaway venv in `work` that has Model Garden (see the module
    docstring); created the first time."""
    import sysconfig

    venv = os.path.join(work, "model-garden-venv")
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(os.path.join(venv, ".done")):
        return python
    print(f"installing {MODEL_GARDEN} into {venv} (once) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", "--without-pip", venv], check=True)
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()["
                              "'purelib'])"], check=True, capture_output=True,
                             text=True).stdout.strip()
    with open(os.path.join(purelib, "tftrain_venv.pth"), "w", encoding="utf-8") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")  # after the venv's own packages
    uv = os.path.join(os.path.dirname(sys.executable), "uv")
    subprocess.run([uv, "pip", "install", "--quiet", "--python", python, "--no-deps",
                    MODEL_GARDEN, *MODEL_GARDEN_IMPORTS], check=True)
    open(os.path.join(venv, ".done"), "w").close()
    return python


def measure(method: str, kind: str, src: str, out: str, memory: bool,
            python: str = sys.executable) -> dict:
    """Runs `child` in a new process; returns its result plus (`memory`) the peak memory of its tree.

    Sampling memory reads /proc of every process of the tree every 20 ms, which takes CPU from
    the run (more so for more processes), so speed is measured in runs without it.
    """
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    os.sync()  # the previous run's shards are on disk, not competing for the CPU in writeback
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    process = subprocess.Popen([python, __file__, "--child", method, kind, src, out],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = 0
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, sum(process_memory(p) for p in process_tree(process.pid)))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True) if memory else None
    if sampler:
        sampler.start()
    stdout, stderr = process.communicate()
    done.set()
    if sampler:
        sampler.join()
    if process.returncode:
        raise SystemExit(f"{method} on {src} failed:\n{stderr[-3000:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    result["peak_mb"] = peak / 2**20 if memory else None
    shutil.rmtree(out, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3, help="runs per method; the fastest counts")
    parser.add_argument("--workdir", default="/tmp/tftrain-bench-convert")
    parser.add_argument("--kinds", default="images,arrays",
                        help="which data to convert: images, arrays or both")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    kinds = [kind for kind in ("images", "arrays") if kind in args.kinds.split(",")]
    if not kinds or set(args.kinds.split(",")) - set(kinds):
        parser.error(f"--kinds={args.kinds}: a comma-separated subset of images,arrays")
    if args.child:
        child(*args.child)
        return
    work = os.path.abspath(args.workdir)
    sources = {("images", 1): os.path.join(work, f"images-{args.images}"),
               ("images", 4): os.path.join(work, f"images-{args.images}-x4"),
               ("arrays", 1): os.path.join(work, f"arrays-{args.rows}"),
               ("arrays", 4): os.path.join(work, f"arrays-{args.rows * 4}")}
    print(f"generating data in {work} (once) ...", flush=True)
    if "images" in kinds:
        make_images(sources[("images", 1)], args.images)
        replicate_images(sources[("images", 1)], sources[("images", 4)], 4)
    if "arrays" in kinds:
        make_arrays(sources[("arrays", 1)], args.rows)
        make_arrays(sources[("arrays", 4)], args.rows * 4)

    pythons = {method: sys.executable for method in METHODS}
    pythons["model_garden"] = model_garden_python(work)

    results, peaks = {}, {}
    for round_index in range(args.repeats + 1):
        memory = round_index == 0  # round 0 measures memory, the others speed
        for kind in kinds:
            for scale in (1, 4):
                for method in METHODS:
                    what = "memory" if memory else f"speed {round_index}"
                    print(f"  {what:<8} {kind:<6} {method:<17} {scale}x ...", end=" ", flush=True)
                    r = measure(method, kind, sources[(kind, scale)], os.path.join(work, "out"),
                                memory, pythons[method])
                    key = (kind, method, scale)
                    if memory:
                        peaks[key] = r["peak_mb"]
                        print(f"peak {r['peak_mb']:,.0f} MB", flush=True)
                        continue
                    print(f"{r['examples'] / r['seconds']:,.0f} ex/s", flush=True)
                    if key not in results or r["seconds"] < results[key]["seconds"]:
                        results[key] = dict(r, peak_mb=peaks[key])

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    data = {"images": f"{args.images:,} 64x64 PNGs", "arrays": f"{args.rows:,} x {FEATURES} float32 rows"}
    print(f"\nconvert benchmark: {' and '.join(data[kind] for kind in kinds)} (1x; 4x for the "
          f"second columns), CPU: {cpu_name()}, {os.cpu_count()} cores, best of {args.repeats} runs, "
          f"load average {load}")
    table = []
    for kind in kinds:
        def speed(method, scale):
            r = results[(kind, method, scale)]
            return r["examples"] / r["seconds"]

        for method in METHODS:
            one, four = results[(kind, method, 1)], results[(kind, method, 4)]
            table.append([kind, METHOD_LABELS[method], f"{speed(method, 1):,.0f}",
                          f"{speed(method, 4):,.0f}",
                          f"{speed(method, 4) / speed('naive', 4):.2f}x",
                          f"{speed(method, 4) / speed('model_garden', 4):.2f}x",
                          f"{one['peak_mb']:,.0f}", f"{four['peak_mb']:,.0f}",
                          f"{four['peak_mb'] / one['peak_mb']:.2f}"])
    print()
    print(markdown_table(["data", "method", "ex/s 1x", "ex/s 4x", "vs naive", "vs Model Garden",
                          "peak MB 1x", "peak MB 4x", "4x/1x"], table))
    print("\n(\"vs\" columns compare the 4x runs: examples/s relative to the naive loop / Model "
          "Garden's own write_tf_record_dataset.)")


if __name__ == "__main__":
    main()

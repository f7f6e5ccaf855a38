"""`tftrain predict` on raw files against the model on the same inputs already decoded in memory.

    .venv/bin/python bench/predict.py [--model=small_cnn|resnet50] [--images=N] [--rounds=3]
                                      [--workdir=...]

Models (data and run made once into --workdir/MODEL; the speed does not depend on the weights):
  small_cnn  --images (default 2000) 64x64 RGB PNGs in 10 class folders (bench/convert.py's),
             converted by `image_folder` (the PNG bytes kept, decoded at read time),
             configs/digits.yaml's CNN trained for 5 steps; batch 256
  resnet50   --images (default 256) 224x224 RGB JPEGs, converted the same way,
             `model.name=application` with `backbone=ResNet50`, weights none, trained for 2
             steps of 8; batch 32 (ResNet50's activations at 256 would hold GBs)
Each run is quantized with `tftrain quantize --mode=int8` (ResNet50's measured on 2 test batches
and calibrated on 16 images: the speed of the int8 model does not depend on them). Prepared
once: ~1 minute for small_cnn, ~2.5 minutes for resnet50; then ~4 and ~7.5 minutes of rounds
(2 cores, shared with other work).

Contenders, each in a fresh process (TensorFlow imported, the model loaded, before the clock):
  predict, SavedModel    `tftrain.optimize.predict.predict` over the folder: list, read, probe
                         and encode each file with the pipeline, `serving_examples` (parse,
                         decode, model), write the CSV; its own clock (after loading the model)
  model.predict          the export loaded by tf-keras, `model.predict(x, batch_size=batch)` on
                         every image already decoded into one float32 array (`x` made first,
                         outside the clock, by the reader's decode of the same rows)
  serving_default        the export's tensor signature on `x`, in batches (the graph
                         `serving_examples` runs after its decode)
  predict, int8 .tflite  as above with the int8 model (the reader's decode, then LiteRT, threads
                         = the cores)
  interpreter            the int8 model on the decoded array, the same batches and threads
  read and decode        what predict adds to the model: list, read and encode every file, then
                         the reader's parse and decode of each batch (no model), one thread
Rounds interleave the contenders; each keeps its fastest examples/s and its least CPU time per
example (user + system of the whole process over the timed part, `time.process_time`; predict's
is `Summary.cpu_seconds`). The ratio is predict's examples/s over its in-memory baseline's. The
CPU times give M (the model's, from the in-memory baseline) and D (read and decode): on C
cores predict can reach at most C / (M + D) examples/s against the baseline's C / M, a ratio
of M / (M + D). Other work on a shared machine slows the examples/s of each round by chance
but hardly moves the CPU per example: the baseline's CPU over predict's is the ratio both
would reach on an idle machine with every core kept busy.
Memory (small_cnn): the peak RSS (`ru_maxrss`) of a process that runs predict on the folder and
on a folder of 16x the files (hard links under new names), SavedModel and int8.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.child import run_child  # noqa: E402
from bench.convert import make_images, replicate_images  # noqa: E402
from bench.table import markdown_table  # noqa: E402
from tftrain.host import cpu_name  # noqa: E402

MODELS = {
    "small_cnn": {"images": 2000, "size": 64, "format": "png", "batch": 256,
                  "overrides": "train.epochs=1,train.steps_per_epoch=5", "quantize": []},
    "resnet50": {"images": 256, "size": 224, "format": "jpeg", "batch": 32,
                 "overrides": "data.batch_size=8,model.name=application,"
                              "model.params={backbone: ResNet50, weights: none},"
                              "train.epochs=1,train.steps_per_epoch=2",
                 # quantize measures its float and int8 models on 2 test batches of 8 (not all
                 # 35) and calibrates on 16 images: the speed here does not depend on them
                 "quantize": ["--steps=2", "--num_calibration_examples=16"]},
}
FILES = {"png": "PNG files", "jpeg": "JPEG files"}
CONTENDERS = ("predict_saved_model", "keras_predict", "signature", "predict_tflite",
              "interpreter", "decode")
LABELS = {"predict_saved_model": "`tftrain predict`, SavedModel (raw {files})",
          "keras_predict": "`model.predict` on decoded inputs in memory",
          "signature": "the export's `serving_default` on decoded inputs in memory",
          "predict_tflite": "`tftrain predict`, int8 .tflite (raw {files})",
          "interpreter": "LiteRT interpreter on decoded inputs in memory"}

CHILD = r"""
import json, os, resource, sys, time
args = json.loads(sys.argv[1])
import tftrain  # noqa: F401
import numpy as np
import tensorflow as tf
from pipelines import dataset_pipeline
from tftrain.data import reader
from tftrain.data import manifest as manifest_lib
from tftrain.optimize import evaluate, predict, tflite_eval

kind, run, folder, out = args["kind"], args["run"], args["folder"], args["out"]
model = run if kind == "predict_saved_model" else f"{run}/quantized/model_int8.tflite"
if kind == "decode":
    data = args["data"]
    manifest = manifest_lib.read(data)
    pipeline = dataset_pipeline(manifest["pipeline"])
    info = manifest["info"]
    decode = predict.instantiated(tf.function(reader.batch_decoder(
        reader.parse_spec(manifest["features"]), pipeline, info),
        autograph=False).get_concrete_function(tf.TensorSpec([None], tf.string)))
    started, cpu = time.perf_counter(), time.process_time()
    examples = [item.example for item in predict.raw_items(pipeline, folder, info)]
    for i in range(0, len(examples), args["batch"]):
        decode(tf.constant(examples[i:i + args["batch"]]))
    count = len(examples)
    rate = count / (time.perf_counter() - started)
elif kind.startswith("predict"):
    summary = predict.predict(model, out, input_path=folder, batch_size=args["batch"],
                              overwrite=True)
    os.remove(out)
    rate = summary.rows / summary.seconds
    count = summary.rows
    cpu = summary.cpu_seconds / count
else:
    data = args["data"]
    manifest = manifest_lib.read(data)
    pipeline = dataset_pipeline(manifest["pipeline"])
    info = manifest["info"]
    decode = reader.batch_decoder(reader.parse_spec(manifest["features"]), pipeline, info)
    examples = [item.example for item in predict.raw_items(pipeline, folder, info)]
    x = np.concatenate([decode(tf.constant(examples[i:i + 1024]))[0].numpy()
                        for i in range(0, len(examples), 1024)])
    count = len(x)
    if kind == "keras_predict":
        keras_model = evaluate.load_saved_model(f"{run}/export")
        keras_model.predict(x[:args["batch"]], batch_size=args["batch"], verbose=0)  # warm-up
        started, cpu = time.perf_counter(), time.process_time()
        keras_model.predict(x, batch_size=args["batch"], verbose=0)
    elif kind == "signature":
        signature = tf.saved_model.load(predict.find_model(run)[0]).signatures["serving_default"]
        batches = [tf.constant(x[i:i + args["batch"]]) for i in range(0, len(x), args["batch"])]
        signature(batches[0])  # warm-up
        started, cpu = time.perf_counter(), time.process_time()
        for batch in batches:
            signature(batch)
    else:
        runner = tflite_eval.TfliteModel(f"{run}/quantized/model_int8.tflite",
                                         len(os.sched_getaffinity(0)), args["batch"])
        batches = [x[i:i + args["batch"]] for i in range(0, len(x), args["batch"])]
        runner.run(batches[0])  # warm-up
        started, cpu = time.perf_counter(), time.process_time()
        for batch in batches:
            runner.resize(len(batch))  # the last batch at its size, as predict runs it
            runner.run(batch)
    rate = count / (time.perf_counter() - started)
if not kind.startswith("predict"):
    cpu = (time.process_time() - cpu) / count
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print("RESULT " + json.dumps({"rate": rate, "count": count, "peak_rss": peak, "cpu": cpu}))
"""


def tftrain_cli(*args: str, cwd: str) -> None:
    """`tftrain <args>` in `cwd` (this checkout's code), failing loudly."""
    environment = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    script = os.path.join(os.path.dirname(sys.executable), "tftrain")
    out = subprocess.run([script, *args], cwd=cwd, env=environment, capture_output=True,
                         text=True)
    if out.returncode:
        raise SystemExit(f"tftrain {' '.join(args)} failed:\n{out.stderr[-3000:]}")


def prepare(work: str, model: dict, images: int) -> dict:
    """The folders (1x, 16x), the converted dataset and the trained run with its int8 model."""
    paths = {"folder": os.path.join(work, f"images-{images}"),
             "folder16": os.path.join(work, f"images-{images}-x16"),
             "data": os.path.join(work, "data"), "run": os.path.join(work, "run")}
    make_images(paths["folder"], images, model["size"], model["format"])
    if not os.path.exists(os.path.join(paths["data"], "dataset.json")):
        tftrain_cli("convert", "--pipeline=image_folder", f"--input={paths['folder']}",
                    f"--output={paths['data']}", cwd=work)
    if not os.path.exists(os.path.join(paths["run"], "quantized", "model_int8.tflite")):
        tftrain_cli("train", "--config=digits", f"--model_dir={paths['run']}", "--overwrite",
                    f"--params_override=data.dir={paths['data']},data.pipeline=image_folder,"
                    + model["overrides"], cwd=work)
        tftrain_cli("quantize", f"--model_dir={paths['run']}", "--mode=int8",
                    "--max_accuracy_drop=1", *model["quantize"], cwd=work)
    return paths


def measure(kind: str, paths: dict, folder: str, batch: int) -> dict:
    return run_child(CHILD, {"kind": kind, "run": paths["run"], "folder": folder,
                             "data": paths["data"], "batch": batch,
                             "out": os.path.join(os.path.dirname(paths["run"]), "out.csv")})


def cpu_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="small_cnn")
    parser.add_argument("--images", type=int, default=None,
                        help="images to predict (default: the model's, see above)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each keeps its fastest")
    parser.add_argument("--workdir", default="/tmp/tftrain-bench-predict")
    args = parser.parse_args()
    model = MODELS[args.model]
    images, batch = args.images or model["images"], model["batch"]
    load_before = os.getloadavg()[0]
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; load average {load_before:.2f}",
          flush=True)
    work = os.path.join(os.path.abspath(args.workdir), args.model)
    os.makedirs(work, exist_ok=True)
    print(f"preparing {images} images, their dataset and a {args.model} run in {work} "
          "(once) ...", flush=True)
    paths = prepare(work, model, images)

    best = {kind: 0.0 for kind in CONTENDERS}
    cpu = {kind: float("inf") for kind in CONTENDERS}
    for round_index in range(args.rounds):
        for kind in CONTENDERS:
            result = measure(kind, paths, paths["folder"], batch)
            best[kind] = max(best[kind], result["rate"])
            cpu[kind] = min(cpu[kind], result["cpu"])
            print(f"  round {round_index + 1} {kind:<20} {result['rate']:,.1f} examples/s, "
                  f"{cpu_ms(result['cpu'])} CPU ms per example", flush=True)
    files = FILES[model["format"]]
    rows, bounds = [], []
    decode = cpu["decode"]
    for kind, baselines in (("predict_saved_model", ("keras_predict", "signature")),
                            ("predict_tflite", ("interpreter",))):
        for baseline in baselines:
            rows.append([LABELS[baseline], f"{best[baseline]:,.1f}", "1.00x",
                         cpu_ms(cpu[baseline]), "1.00x"])
            rows.append([LABELS[kind].format(files=files), f"{best[kind]:,.1f}",
                         f"{best[kind] / best[baseline]:.2f}x", cpu_ms(cpu[kind]),
                         f"{cpu[baseline] / cpu[kind]:.2f}x"])
            bounds.append([LABELS[baseline], cpu_ms(cpu[baseline]), cpu_ms(decode),
                           f"{cpu[baseline] / (cpu[baseline] + decode):.2f}x"])
    size = model["size"]
    print(f"\n{args.model}: {images} images of {size}x{size}x3 ({model['format'].upper()}), "
          f"batch {batch}; best of {args.rounds} rounds; {datetime.date.today()}, load "
          f"average {load_before:.2f} before the bench, {os.getloadavg()[0]:.2f} after\n")
    print(markdown_table(["what runs", "examples/s", "vs its in-memory baseline",
                          "CPU ms per example", "CPU: baseline's / this"], rows,
                         ["l", "r", "r", "r", "r"]))
    print()
    print(markdown_table(["in-memory baseline", "M: its CPU ms per example",
                          "D: list, read, encode, decode", "bound M / (M + D)"], bounds,
                         ["l", "r", "r", "r"]))
    if args.model != "small_cnn":
        return

    replicate_images(paths["folder"], paths["folder16"], 16)
    memory_rows = []
    for kind in ("predict_saved_model", "predict_tflite"):
        one = measure(kind, paths, paths["folder"], batch)
        many = measure(kind, paths, paths["folder16"], batch)
        memory_rows.append([LABELS[kind].format(files=files), f"{one['count']:,}",
                            f"{one['peak_rss'] / 2**20:,.0f}", f"{many['count']:,}",
                            f"{many['peak_rss'] / 2**20:,.0f}",
                            f"{many['peak_rss'] / one['peak_rss']:.2f}x"])
    print()
    print(markdown_table(["what runs", "files (1x)", "peak RSS MiB", "files (16x)",
                          "peak RSS MiB", "16x / 1x"], memory_rows,
                         ["l", "r", "r", "r", "r", "r"]))


if __name__ == "__main__":
    main()

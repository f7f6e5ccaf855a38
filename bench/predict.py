"""`tftrain predict` on raw files against the model on the same inputs already decoded in memory.

    .venv/bin/python bench/predict.py [--images=2000] [--rounds=3] [--workdir=...]

Data and run (made once into --workdir): --images 64x64 RGB PNGs in 10 class folders
(bench/convert.py's), converted by `image_folder` (the PNG bytes kept, decoded at read time),
configs/digits.yaml's CNN trained on them for a few steps (the speed does not depend on the
weights), and its int8 `.tflite` (`tftrain quantize --mode=int8`).

Contenders, each in a fresh process (TensorFlow imported, the model loaded, before the clock):
  predict, SavedModel    `tftrain.optimize.predict.predict` over the folder: list, read, probe
                         and encode each file with the pipeline, `serving_examples` (parse, PNG
                         decode, model), write the CSV; its own clock (after loading the model)
  model.predict          the export loaded by tf-keras, `model.predict(x, batch_size=256)` on
                         every image already decoded into one float32 array (`x` made first,
                         outside the clock, by the reader's decode of the same rows)
  serving_default        the export's tensor signature on `x`, in batches of 256 (the graph
                         `serving_examples` runs after its decode)
  predict, int8 .tflite  as above with the int8 model (the reader's decode, then LiteRT at
                         batch 256, threads = the cores)
  interpreter            the int8 model on the decoded array, batch 256, the same threads
Rounds interleave the five; each keeps its fastest. The ratio is predict's examples/s over its
in-memory baseline's. Memory: the peak RSS (`ru_maxrss`) of a process that runs predict on the
folder and on a folder of 16x the files (hard links under new names), SavedModel and int8.
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

BATCH = 256
CONTENDERS = ("predict_saved_model", "keras_predict", "signature", "predict_tflite",
              "interpreter")
LABELS = {"predict_saved_model": "`tftrain predict`, SavedModel (raw PNG files)",
          "keras_predict": "`model.predict` on decoded inputs in memory",
          "signature": "the export's `serving_default` on decoded inputs in memory",
          "predict_tflite": "`tftrain predict`, int8 .tflite (raw PNG files)",
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
if kind.startswith("predict"):
    summary = predict.predict(model, out, input_path=folder, batch_size=args["batch"],
                              overwrite=True)
    os.remove(out)
    rate = summary.rows / summary.seconds
    count = summary.rows
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
        started = time.perf_counter()
        keras_model.predict(x, batch_size=args["batch"], verbose=0)
    elif kind == "signature":
        signature = tf.saved_model.load(predict.find_model(run)[0]).signatures["serving_default"]
        batches = [tf.constant(x[i:i + args["batch"]]) for i in range(0, len(x), args["batch"])]
        signature(batches[0])  # warm-up
        started = time.perf_counter()
        for batch in batches:
            signature(batch)
    else:
        runner = tflite_eval.TfliteModel(f"{run}/quantized/model_int8.tflite",
                                         len(os.sched_getaffinity(0)), args["batch"])
        batches = [x[i:i + args["batch"]] for i in range(0, len(x), args["batch"])]
        batches[-1] = np.concatenate([batches[-1], np.repeat(
            batches[-1][-1:], args["batch"] - len(batches[-1]), axis=0)])
        runner.run(batches[0])  # warm-up
        started = time.perf_counter()
        for batch in batches:
            runner.run(batch)
    rate = count / (time.perf_counter() - started)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print("RESULT " + json.dumps({"rate": rate, "count": count, "peak_rss": peak}))
"""


def tftrain_cli(*args: str, cwd: str) -> None:
    """`tftrain <args>` in `cwd` (this checkout's code), failing loudly."""
    environment = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    script = os.path.join(os.path.dirname(sys.executable), "tftrain")
    out = subprocess.run([script, *args], cwd=cwd, env=environment, capture_output=True,
                         text=True)
    if out.returncode:
        raise SystemExit(f"tftrain {' '.join(args)} failed:\n{out.stderr[-3000:]}")


def prepare(work: str, images: int) -> dict:
    """The folders (1x, 16x), the converted dataset and the trained run with its int8 model."""
    paths = {"folder": os.path.join(work, f"images-{images}"),
             "folder16": os.path.join(work, f"images-{images}-x16"),
             "data": os.path.join(work, "data"), "run": os.path.join(work, "run")}
    make_images(paths["folder"], images)
    replicate_images(paths["folder"], paths["folder16"], 16)
    if not os.path.exists(os.path.join(paths["data"], "dataset.json")):
        tftrain_cli("convert", "--pipeline=image_folder", f"--input={paths['folder']}",
                    f"--output={paths['data']}", cwd=work)
    if not os.path.exists(os.path.join(paths["run"], "quantized", "model_int8.tflite")):
        tftrain_cli("train", "--config=digits", f"--model_dir={paths['run']}", "--overwrite",
                    f"--params_override=data.dir={paths['data']},data.pipeline=image_folder,"
                    "train.epochs=1,train.steps_per_epoch=5", cwd=work)
        tftrain_cli("quantize", f"--model_dir={paths['run']}", "--mode=int8",
                    "--max_accuracy_drop=1", cwd=work)
    return paths


def measure(kind: str, paths: dict, folder: str) -> dict:
    return run_child(CHILD, {"kind": kind, "run": paths["run"], "folder": folder,
                             "data": paths["data"], "batch": BATCH,
                             "out": os.path.join(os.path.dirname(paths["run"]), "out.csv")})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each keeps its fastest")
    parser.add_argument("--workdir", default="/tmp/tftrain-bench-predict")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores", flush=True)
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    print(f"preparing {args.images} images, their dataset and a run in {work} (once) ...",
          flush=True)
    paths = prepare(work, args.images)

    best = {kind: 0.0 for kind in CONTENDERS}
    for round_index in range(args.rounds):
        for kind in CONTENDERS:
            result = measure(kind, paths, paths["folder"])
            best[kind] = max(best[kind], result["rate"])
            print(f"  round {round_index + 1} {kind:<20} {result['rate']:,.0f} examples/s",
                  flush=True)
    rows = []
    for kind, baselines in (("predict_saved_model", ("keras_predict", "signature")),
                            ("predict_tflite", ("interpreter",))):
        for baseline in baselines:
            rows.append([LABELS[baseline], f"{best[baseline]:,.0f}", "1.00x"])
            rows.append([LABELS[kind], f"{best[kind]:,.0f}",
                         f"{best[kind] / best[baseline]:.2f}x"])
    print(f"\n{args.images} images of 64x64x3 (PNG), batch {BATCH}; best of {args.rounds} "
          f"rounds; {datetime.date.today()}, load average {os.getloadavg()[0]:.2f}\n")
    print(markdown_table(["what runs", "examples/s", "vs its in-memory baseline"], rows,
                         ["l", "r", "r"]))

    memory_rows = []
    for kind in ("predict_saved_model", "predict_tflite"):
        one = measure(kind, paths, paths["folder"])
        many = measure(kind, paths, paths["folder16"])
        memory_rows.append([LABELS[kind], f"{one['count']:,}", f"{one['peak_rss'] / 2**20:,.0f}",
                            f"{many['count']:,}", f"{many['peak_rss'] / 2**20:,.0f}",
                            f"{many['peak_rss'] / one['peak_rss']:.2f}x"])
    print()
    print(markdown_table(["what runs", "files (1x)", "peak RSS MiB", "files (16x)",
                          "peak RSS MiB", "16x / 1x"], memory_rows,
                         ["l", "r", "r", "r", "r", "r"]))


if __name__ == "__main__":
    main()

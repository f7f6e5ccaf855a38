"""Training recipes: what each augmentation and label smoothing buy on a small-data image task,
what they cost the input, and tftrain's augmented input against Model Garden's parser.

    python bench/recipes.py [--parts=input,recipes,cost] [--seeds=3] [--steps=300]
                            [--settings=1,2,...] [--images=400] [--rounds=3] [--passes=10]
                            [--workdir=/tmp/tftrain-bench/recipes]

Data (made once into --workdir by bench/recipe_data.py, from scikit-learn's two sample photos):
ImageNet-layout TFRecords of --images photo-like JPEGs (300..500 px a side, 1-based labels,
bbox features), and the small-data task: 64x64 crops of 12 regions of the photos (240 train /
120 validation / 1,200 test images, test crops from other parts of each region than the
training crops), converted with `tftrain convert --pipeline=image_folder` at image_size 32.

Parts:
  input    images/s at 224x224 with random-resized crop + horizontal flip, training mode, batch
           64, side by side in one process, --rounds interleaved rounds of --passes passes
           each (best and range; CPU time per image, the least):
           Model Garden's own `official.core.input_reader.InputReader` over its
           `classification_input.Decoder` and `Parser` (tf-models-official, installed by the
           bench into a throwaway venv in --workdir, never a tftrain dependency: see
           bench/convert.py) with `image_classification.DataConfig`'s defaults, against
           `tftrain.data.load(training=True)` reading the same files as foreign TFRecords
           (`data.format=tfrecord`: pipeline image_folder at 224, 1001 classes) with
           `augment={random_resized_crop: true, flip: true}` (also with `autotune=False`, the
           crop alone, and no augmentation: the whole JPEG decoded and resized, for reference).
           Both maps run with tf.data AUTOTUNE.
  recipes  the plain recipe (the CNN below, Adam 0.002 cosine, batch 32, --steps steps) against
           each addition alone, the standard set (crop + flip + label smoothing 0.1) and all
           together, each trained with `tftrain train`'s code (`tftrain.engine.train.train`)
           once per seed (the seed fixes the initial weights, the data order and the draws):
           test accuracy and loss, mean ± standard deviation over the seeds, and the paired
           difference in accuracy against plain.
  cost     the training input's examples/s per setting (`tftrain doctor`'s input measurement:
           the pipeline `train` reads, alone, best of 2 rounds) against the model's step alone
           (`tftrain doctor` on the plain setting).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import recipe_data  # noqa: E402
from bench.big_data import TFTRAIN  # noqa: E402
from bench.table import markdown_table  # noqa: E402
from tftrain.host import cpu_name  # noqa: E402

INPUT_BATCH, INPUT_SIZE, NUM_CLASSES = 64, 224, 1001
CROP_FLIP = {"random_resized_crop": True, "flip": True}
MODEL = "cnn"
MODEL_PARAMS = "{filters: [16, 32], dense_units: 64, dropout: 0.25}"
STEPS_PER_EPOCH = 50  # validation and backup every 50 steps, not every pass of 240 images
IMAGE_SIZE = 32  # the 64x64 crops as the model sees them (the crop is taken before resizing)
# Model Garden's recipe values (imagenet_resnet50_tpu.yaml, MixupAndCutmix, RandAugment).
ALL = ("{random_resized_crop: true, flip: true, randaugment: {num_layers: 2, magnitude: 10}, "
       "random_erasing: 0.25, mixup_alpha: 0.8, cutmix_alpha: 1.0}")
SETTINGS = {  # row -> params_override added to the plain recipe
    "plain": "",
    "random_resized_crop": "data.augment={random_resized_crop: true}",
    "flip": "data.augment={flip: true}",
    "randaugment (2 layers, magnitude 10)":
        "data.augment={randaugment: {num_layers: 2, magnitude: 10}}",
    "random_erasing 0.25": "data.augment={random_erasing: 0.25}",
    "mixup 0.8": "data.augment={mixup_alpha: 0.8}",
    "cutmix 1.0": "data.augment={cutmix_alpha: 1.0}",
    "label_smoothing 0.1": "task.label_smoothing=0.1",
    "standard: crop + flip + label_smoothing 0.1":
        "data.augment={random_resized_crop: true, flip: true},task.label_smoothing=0.1",
    "all together (+ label_smoothing 0.1)": f"data.augment={ALL},task.label_smoothing=0.1",
}
PARTS = ("input", "recipes", "cost")


def spread(values: list[float], digits: int = 3) -> str:
    """`mean ± standard deviation` (sample) of `values`."""
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


# --- input: tftrain against Model Garden's parser -------------------------------------------

def input_pipelines(files: list[str]) -> dict:
    """row -> a function returning a fresh repeated training dataset over `files` (run in the
    Model Garden venv's python)."""
    from official.core import input_reader
    from official.vision.configs import image_classification
    from official.vision.dataloaders import classification_input

    from tftrain.data import load

    def model_garden():
        params = image_classification.DataConfig(input_path=files, global_batch_size=INPUT_BATCH,
                                                 is_training=True)
        decoder = classification_input.Decoder()
        parser = classification_input.Parser(output_size=[INPUT_SIZE, INPUT_SIZE],
                                             num_classes=NUM_CLASSES, aug_rand_hflip=True,
                                             aug_crop=True)
        return input_reader.InputReader(params, decoder_fn=decoder.decode,
                                        parser_fn=parser.parse_fn(True)).read()

    def tftrain(augment: dict, autotune: bool = True):
        pattern = os.path.join(os.path.dirname(files[0]), "{split}-*")
        return lambda: load(pattern, "train", INPUT_BATCH, training=True, seed=0, repeat=True,
                            pipeline="image_folder", pipeline_options={"image_size": INPUT_SIZE},
                            info={"num_classes": NUM_CLASSES}, augment=augment,
                            autotune=autotune)

    return {"Model Garden `Parser` (crop + flip), its `InputReader`": model_garden,
            "`tftrain.data.load`, `augment={random_resized_crop: true, flip: true}`":
                tftrain(CROP_FLIP),
            "the same, `data.autotune=false`": tftrain(CROP_FLIP, autotune=False),
            "`tftrain.data.load`, crop only (`augment={random_resized_crop: true}`)":
                tftrain({"random_resized_crop": True}),
            "`tftrain.data.load`, no augmentation (whole image resized)": tftrain({})}


def input_child(args: dict) -> None:
    """The input part's measurements, in the Model Garden venv; prints `RESULT <json>`."""
    import tftrain  # noqa: F401  (tf-keras before TensorFlow)

    from bench.input import examples_per_second

    made = input_pipelines(args["files"])
    rates: dict[str, list] = {row: [] for row in made}
    for round_index in range(args["rounds"]):
        for row, make in made.items():
            rate, cpu, _ = examples_per_second(make, args["images"] * args["passes"],
                                               args["images"] // 2)
            rates[row].append([rate, cpu])
            print(f"  round {round_index + 1}: {row} {rate:,.1f} images/s, "
                  f"{cpu * 1e3:.1f} CPU ms/image", file=sys.stderr, flush=True)
    print("RESULT " + json.dumps(rates))


def input_part(work: str, images: int, rounds: int, passes: int) -> str:
    """The input table (Model Garden's parser against tftrain's augmented reader)."""
    from bench.convert import MODEL_GARDEN, model_garden_python

    files = recipe_data.write_imagenet_records(os.path.join(work, f"imagenet{images}"), images)
    python = model_garden_python(work)
    done = subprocess.run(
        [python, os.path.abspath(__file__), "--input_child",
         json.dumps({"files": files, "images": images, "rounds": rounds, "passes": passes})],
        env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True,
        text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    print(done.stderr, end="")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    rates = json.loads(line[len("RESULT "):])
    best = {row: max(r[0] for r in runs) for row, runs in rates.items()}
    garden = next(iter(best.values()))
    cores, rows = os.cpu_count() or 1, []
    for row, runs in rates.items():
        fastest = max(runs)
        least_cpu = min(r[1] for r in runs)
        rows.append([row, f"{fastest[0]:,.0f}",
                     f"{min(r[0] for r in runs):,.0f}–{fastest[0]:,.0f}",
                     f"{best[row] / garden:.2f}x", f"{least_cpu * 1e3:.2f}",
                     f"{cores / least_cpu:,.0f}"])
    ratios = ", ".join(f"{ours[0] / theirs[0]:.2f}x" for ours, theirs
                       in zip(list(rates.values())[1], list(rates.values())[0]))
    return "\n".join([
        f"{images} ImageNet-layout records (JPEG, 300..500 px a side), {INPUT_SIZE}x{INPUT_SIZE} "
        f"output, batch {INPUT_BATCH}, training mode; {MODEL_GARDEN}; best of {rounds} rounds",
        "", markdown_table(["pipeline", "images/s (best)", "range over rounds", "vs Model Garden",
                            "CPU ms/image (least)", f"limit on {cores} cores (cores / CPU)"],
                           rows, ["l", "r", "r", "r", "r", "r"]),
        "", f"per round, tftrain crop + flip / Model Garden: {ratios}"])


# --- recipes and cost on the small-data task ------------------------------------------------

def photo_dataset(work: str) -> str:
    """The small-data task's dataset dir, converted once with `tftrain convert`."""
    source = os.path.join(work, "photos")
    recipe_data.write_photo_folder(source)
    data_dir = os.path.join(work, "data", f"photos{IMAGE_SIZE}")
    if not os.path.exists(os.path.join(data_dir, "dataset.json")):
        subprocess.run([TFTRAIN, "convert", "--pipeline=image_folder", f"--input={source}",
                        f"--output={data_dir}", f"--pipeline_options=image_size={IMAGE_SIZE}"],
                       check=True, capture_output=True, cwd=REPO,
                       env=dict(os.environ, PYTHONPATH=REPO))
    return data_dir


def build_config(data_dir: str, setting: str, steps: int, seed: int):
    """The config of one training: the plain recipe plus `setting`'s overrides."""
    from tftrain import config as config_lib

    overrides = (f"data.dir={data_dir},data.pipeline=image_folder,data.batch_size=32,"
                 "data.eval_split=validation,data.test_split=test,"
                 f"model.name={MODEL},model.params={MODEL_PARAMS},train.optimizer=adam,"
                 "train.learning_rate=0.002,train.lr_schedule=cosine,"
                 f"train.steps={steps},train.steps_per_epoch={STEPS_PER_EPOCH},train.seed={seed}")
    return config_lib.build_config("digits", overrides=",".join(
        part for part in (overrides, SETTINGS[setting]) if part))


def recipes_part(data_dir: str, seeds: int, steps: int, settings: list[str]) -> str:
    """The recipes table: each of `settings`' (with plain first) test accuracy and loss over
    the seeds."""
    from tftrain.engine import train

    evals: dict[str, list] = {setting: [] for setting in ["plain", *settings]}
    with tempfile.TemporaryDirectory() as runs:
        for seed in range(seeds):
            for index, setting in enumerate(evals):
                result = train.train(build_config(data_dir, setting, steps, seed),
                                     os.path.join(runs, f"{index}-{seed}"))["eval"]
                evals[setting].append(result)
                print(f"  seed {seed} {setting}: accuracy {result['accuracy']:.4f}, "
                      f"loss {result['loss']:.3f}", flush=True)
    plain = [e["accuracy"] for e in evals["plain"]]
    rows = []
    for setting, results in evals.items():
        accuracy = [e["accuracy"] for e in results]
        delta = [(a - p) * 100 for a, p in zip(accuracy, plain)]
        rows.append([setting, spread(accuracy), spread([e["loss"] for e in results]),
                     "" if setting == "plain" else spread(delta, 1)])
    return "\n".join([
        f"{seeds} seeds, {steps} steps of batch 32 each; CNN {MODEL_PARAMS} at "
        f"{IMAGE_SIZE}x{IMAGE_SIZE}, Adam 0.002 with cosine decay (mean ± std over seeds)", "",
        markdown_table(["recipe", "test accuracy", "test loss", "Δ accuracy vs plain, points "
                        "(paired)"], rows, ["l", "r", "r", "r"])])


def cost_part(data_dir: str, steps: int, settings: list[str]) -> str:
    """The cost table: the training input's examples/s per setting against the model's step."""
    from tftrain import doctor
    from tftrain.doctor import measure

    model_alone = doctor.run(build_config(data_dir, "plain", steps, 0),
                             steps=100)["examples_per_second"]["model_alone"]
    rates: dict[str, float] = {}
    for _ in range(2):  # interleaved rounds; the best counts (the machine may be shared)
        for setting in ["plain", *settings]:
            if setting.startswith("label_smoothing"):
                continue  # the loss only: nothing in the input
            config = build_config(data_dir, setting, steps, 0)
            rate = measure.input_rate(measure.host_input(config), 200, config.data.batch_size)
            rates[setting] = max(rates.get(setting, 0.0), rate)
    rows = [[setting, f"{rate:,.0f}", f"{rate / rates['plain']:.2f}x",
             f"{model_alone / rate * 100:.0f} %"] for setting, rate in rates.items()]
    return "\n".join([
        f"the model's step alone (`tftrain doctor`, replayed batches): {model_alone:,.0f} "
        "examples/s", "",
        markdown_table(["input", "examples/s (input alone)", "vs plain",
                        "input time / model step time"], rows, ["l", "r", "r", "r"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS), help="input,recipes,cost")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--passes", type=int, default=10, help="input: passes timed per round")
    parser.add_argument("--workdir", default="/tmp/tftrain-bench/recipes")
    parser.add_argument("--settings", default="",
                        help="recipes and cost: the rows (numbers in the order below) besides "
                             "plain; default all: " + ", ".join(
                                 f"{i}={name}" for i, name in enumerate(SETTINGS) if i))
    parser.add_argument("--input_child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.input_child:
        input_child(json.loads(args.input_child))
        return
    names = list(SETTINGS)
    chosen = args.settings.split(",") if args.settings else [str(i) for i in range(1, len(names))]
    if any(not i.isdigit() or not 0 < int(i) < len(names) for i in chosen):
        parser.error(f"--settings={args.settings}: numbers from 1 to {len(names) - 1}")
    settings = [names[int(i)] for i in chosen]
    parts = args.parts.split(",")
    if set(parts) - set(PARTS):
        parser.error(f"--parts={args.parts}: a comma-separated subset of {','.join(PARTS)}")
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores", flush=True)
    tables = []
    if "input" in parts:
        tables.append(input_part(work, args.images, args.rounds, args.passes))
    if "recipes" in parts or "cost" in parts:
        data_dir = photo_dataset(work)
        if "recipes" in parts:
            tables.append(recipes_part(data_dir, args.seeds, args.steps, settings))
        if "cost" in parts:
            tables.append(cost_part(data_dir, args.steps, settings))
    load_average = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nload average {load_average}\n")
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()

"""Pipeline stages: step time and each device's share of the model, one device against S stages
with M micro-batches.

    .venv/bin/python bench/pipeline.py [--width=256] [--num_layers=8] [--sequence_length=128]
                                       [--batch_size=32] [--steps=5]
    .venv/bin/python bench/pipeline.py --schedules [--width=128] [--num_layers=4]
                                       [--sequence_length=512] [--microbatch_size=4]
                                       [--counts=4,8,16]
                                       [--schedule_names=gpipe,1f1b,interleaved,1f1bx2]

The same `transformer_lm` (tftrain's builder, Adam, float32) trains `--steps` steps on random
token ids after one warm-up step: once as one model on one device, then cut into stages by
`runtime.pipeline_stages` and trained by `PipelineModel` as `tftrain train
--strategy=pipeline` trains it, each setting in its own process. Without GPUs the stages are
virtual CPU devices that share this machine's cores, so the table shows the schedule's cost
(more, smaller ops; the bubble) and how the model's bytes split, not a speed-up: run the same
command on a host with S GPUs (it uses them when present) to measure the overlap, and compare
the step time with the bubble fraction (S-1)/(M+S-1). Prints the CPU and the table.

`--schedules`: 2 stages under `gpipe`, `1f1b` and `interleaved` (2 chunks per stage;
`runtime.pipeline_schedule`), and 2 stages x 2 replicas under `1f1b` on 4 devices (`1f1bx2`),
at 4, 8 and 16 micro-batches of `--microbatch_size` windows each (the batch grows with the
count, and doubles for the 2 replicas), on an activation-heavy model (long windows). Besides
the step time, from one more step traced by TensorFlow's profiler (`bench/trace.py`: the most
bytes the step's tensors requested at once, its allocations replayed in time order): each
device's tensors' peak (its weights and optimizer state, plus its passes' tensors: the
activations the schedule holds and its gradients; what that device's memory would show on a
host with a GPU per stage) beside `tftrain check`'s plan of each stage, and all devices' tensors
at once (the virtual devices share the CPU's allocator, so their peaks add up as their
concurrent passes happen to overlap). Then, over the timed steps (after a warm-up step),
TensorFlow's allocator peak (its in-use count: the chunks its BFC allocator handed out, which
may be up to twice a request, as a GPU's allocator counts them; it moves with the order of
the allocations, so from run to run and with the number of steps), what the allocator still
holds after the steps (weights, optimizer state, and what the step's program keeps between
steps) and the process's resident peak (the kernel's high-water mark, which also holds the
program and TensorFlow's runtime, and memory freed but not returned to the system).
"""
from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.child import run_child  # noqa: E402
from bench.table import markdown_table  # noqa: E402
from tftrain.host import cpu_name  # noqa: E402

CHILD = r'''
import json, re, sys, time
import tftrain  # noqa: F401  (tf-keras before TensorFlow)
import numpy as np, tensorflow as tf, tf_keras as keras
from bench import trace
from tftrain import models
from tftrain.config_schema import RuntimeConfig
from tftrain.engine import run_memory
from tftrain.runtime import pipeline_model, pipeline_stages



def planned_stage_bytes(args, params, length, vocab):
    """`tftrain check`'s memory plan of each stage for this setting (float32, Adam)."""
    from tftrain.check import memory
    from tftrain.config import build_config
    from tftrain.rules.report import Target

    config = build_config("", overrides=(
        f"model.name=transformer_lm,model.params={json.dumps(params)},train.optimizer=adam,"
        f"data.batch_size={args['batch_size']},runtime.strategy=pipeline,"
        f"runtime.pipeline_stages={args['stages']},runtime.microbatches={args['microbatches']},"
        f"runtime.pipeline_schedule={args.get('schedule', '1f1b')},"
        f"runtime.virtual_stages={args.get('virtual', 1)},"
        f"runtime.pipeline_replicas={args.get('replicas', 1)}"))
    shapes = memory.shapes_of(config, lambda p: models.build_model(
        "transformer_lm", p, (length,), vocab, {"vocab_size": vocab, "sequence_length": length}))
    found = memory.plan(shapes, config, Target("cpu", 1), "float32")
    return [stage["bytes"] for stage in found.stages] * args.get("replicas", 1)


args = json.loads(sys.argv[1])
stages, microbatches = args["stages"], args["microbatches"]
virtual, replicas = args.get("virtual", 1), args.get("replicas", 1)
devices = pipeline_stages.devices(RuntimeConfig(pipeline_stages=max(stages, 2),
                                                pipeline_replicas=replicas))[:stages * replicas]
length, vocab = args["sequence_length"], 1024
keras.utils.set_random_seed(0)  # the same initial weights in every setting
params = {k: args[k] for k in ("width", "num_layers", "num_heads", "mlp_width")}
model = models.build_model("transformer_lm", params, (length,), vocab,
                           {"vocab_size": vocab, "sequence_length": length})
if stages > 1:
    chunks = pipeline_stages.plan(model, stages, virtual=virtual)
    placed = pipeline_stages.chunk_devices(devices, stages, virtual)
    parts = [part for r in range(replicas) for part in pipeline_stages.build(
        model, chunks, placed[r * stages * virtual:(r + 1) * stages * virtual])]
    model = pipeline_model.PipelineModel(parts, placed, microbatches,
                                         schedule=args.get("schedule", "1f1b"),
                                         replicas=replicas, virtual_stages=virtual)
model.compile(keras.optimizers.Adam(1e-4),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True))
ids = tf.constant(np.random.default_rng(0).integers(1, vocab, (args["batch_size"], length)),
                  tf.int32)
model.train_on_batch(ids, ids)
# the timed steps' own peaks below: TensorFlow's allocator (the tensors: what a GPU's memory
# would hold) and the kernel's high-water mark of the process's resident memory (VmHWM)
tf.config.experimental.reset_memory_stats("CPU:0")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
started = time.perf_counter()
for _ in range(args["steps"]):
    loss = model.train_on_batch(ids, ids)
seconds = (time.perf_counter() - started) / args["steps"]
held = run_memory.bytes_by_device(model.weights + run_memory.optimizer_state(model.optimizer))
tensors = tf.config.experimental.get_memory_info("CPU:0")
with open("/proc/self/status") as f:
    peak = int(next(l for l in f if l.startswith("VmHWM:")).split()[1]) * 1024
# one more step, traced: the most bytes its tensors requested at once, on top of the weights
# and optimizer state held throughout: on each device (a pass's tensors are its stage's,
# replica r's stage s on device r * S + s), and on all at once (they share the CPU's allocator)
space = trace.traced(lambda: model.train_on_batch(ids, ids))
step_peak = trace.tensor_peak_bytes(space)


def device_of(allocator, op):
    found = re.search(r"(?:replica_(\d+)/)?stage_(\d+)_", op)
    return int(found.group(1) or 0) * stages + int(found.group(2)) if found else None


device_step_peak = trace.tensor_peak_bytes(space, device_of)
held_on = {device.split("device:")[-1]: n for device, n in held.items()}
device_peak = [held_on.get(device.split("device:")[-1], 0) + device_step_peak.get(index, 0)
               for index, device in enumerate(devices)] if stages > 1 else []
planned = planned_stage_bytes(args, params, length, vocab) if stages > 1 else []
print("RESULT " + json.dumps({"seconds_per_step": seconds, "loss": float(np.ravel(loss)[0]),
                              "peak_bytes": peak, "allocator_peak_bytes": tensors["peak"],
                              "tensor_peak_bytes": sum(held.values()) + sum(step_peak.values()),
                              "device_peak_bytes": device_peak,
                              "tensor_held_bytes": tensors["current"],
                              "planned_stage_bytes": planned,
                              "largest_device_bytes": max(held.values()),
                              "total_bytes": sum(held.values())}))
'''


def run(args: dict) -> dict:
    """One setting in a fresh process."""
    return run_child(CHILD, args)


def schedules(args: dict) -> None:
    """The schedules' table: 2 stages, each of `--schedule_names` at each of `--counts`
    micro-batches."""
    rows, counts, names = [], args.pop("counts"), args.pop("schedule_names")
    for micro in counts:
        for name in names:
            schedule, replicas = name.split("x") if "x" in name else (name, "1")
            virtual = 2 if schedule == "interleaved" else 1
            batch = micro * args["microbatch_size"] * int(replicas)
            r = run({**args, "stages": 2, "microbatches": micro, "schedule": schedule,
                     "virtual": virtual, "replicas": int(replicas), "batch_size": batch})
            planned, peaks = r["planned_stage_bytes"], r["device_peak_bytes"]
            fullest = max(range(len(peaks)), key=peaks.__getitem__)
            label = (f"{schedule}, V=2" if virtual > 1 else
                     f"{schedule}, 2x{replicas} replicas" if replicas != "1" else schedule)
            rows.append([label, micro, batch, f"{r['seconds_per_step']:.3f}",
                         " / ".join(f"{p / 2**20:,.1f}" for p in peaks),
                         " / ".join(f"{p / 2**20:,.0f}" for p in planned),
                         f"{planned[fullest] / peaks[fullest]:.2f}",
                         f"{r['tensor_peak_bytes'] / 2**20:,.1f}",
                         f"{r['allocator_peak_bytes'] / 2**20:,.0f}",
                         f"{r['tensor_held_bytes'] / 2**20:,.0f}",
                         f"{r['peak_bytes'] / 2**20:,.0f}", f"{r['loss']:.4f}"])
            print("   ", rows[-1], flush=True)
    print(f"transformer_lm width {args['width']}, {args['num_layers']} blocks, sequence "
          f"{args['sequence_length']}, micro-batches of {args['microbatch_size']} windows, "
          "2 stages on virtual CPU devices, Adam, float32")
    print(markdown_table(["setting", "micro-batches", "batch", "s/step",
                          "each device's tensors' peak MiB", "check's plan MiB",
                          "plan / peak (fullest)", "all devices' tensors' peak MiB",
                          "allocator's peak MiB", "held after the steps MiB",
                          "process peak MiB", "loss"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", action="store_true")
    parser.add_argument("--counts", default="4,8,16", help="--schedules: micro-batch counts")
    parser.add_argument("--schedule_names", default="gpipe,1f1b,interleaved,1f1bx2",
                        help="--schedules: which (interleaved: 2 chunks per stage; 1f1bx2: 2 "
                             "replicas of the 2 stages, on 4 devices)")
    for name, default in (("width", None), ("num_layers", None), ("num_heads", 4),
                          ("mlp_width", None), ("sequence_length", None), ("batch_size", 32),
                          ("microbatch_size", 4), ("steps", 5)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = vars(parser.parse_args())
    counts, names = [int(c) for c in args.pop("counts").split(",")], args.pop("schedule_names")
    # the stage table's model, or the schedules' activation-heavy one (long windows)
    for name, (stage_default, schedule_default) in {
            "width": (256, 128), "num_layers": (8, 4), "mlp_width": (1024, 512),
            "sequence_length": (128, 512)}.items():
        if args[name] is None:
            args[name] = schedule_default if args["schedules"] else stage_default
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores", flush=True)
    if args.pop("schedules"):
        schedules({**args, "counts": counts, "schedule_names": names.split(",")})
        return
    settings = [(1, 1), (2, 1), (2, 4), (2, 8), (4, 8)]
    results = {s: run({**args, "stages": s[0], "microbatches": s[1]}) for s in settings}
    one = results[(1, 1)]
    rows = []
    for (stages, micro), r in results.items():
        bubble = (stages - 1) / (micro + stages - 1)
        rows.append(["one device" if stages == 1 else f"{stages} stages, {micro} micro-batches",
                     f"{bubble:.2f}", f"{r['seconds_per_step']:.3f}",
                     f"{r['seconds_per_step'] / one['seconds_per_step']:.2f}x",
                     f"{r['largest_device_bytes'] / 2**20:.1f}",
                     f"{r['largest_device_bytes'] / one['largest_device_bytes']:.2f}x",
                     f"{r['loss']:.4f}"])
    print(f"transformer_lm width {args['width']}, {args['num_layers']} blocks, sequence "
          f"{args['sequence_length']}, batch {args['batch_size']}, Adam, float32; "
          "weights + Adam state on the fullest device")
    print(markdown_table(["setting", "bubble", "s/step", "vs one device", "MiB on a device",
                          "vs one device", "loss"], rows))


if __name__ == "__main__":
    main()

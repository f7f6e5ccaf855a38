"""Memory: a plan of one device's bytes in a training step, by part, against its memory.

Per device (a TPU core or chip, a GPU, this host for `cpu`), the device that holds the most:

  weights          every variable (float32), divided by its shards under DTensor (its layout
                   from the rules training uses: `dtensor_layouts.make_rules` + `resolve`)
  compute_copies   2 bytes per weight under mixed_bfloat16/mixed_float16 (the layers' casts)
  gradients        4 bytes per trainable weight, sharded like it; twice with
                   train.grad_accum_steps > 1 (the running sums beside each micro-batch's)
  optimizer_state  per trainable weight, the slots of `optimizers.slot_shapes` (Adam 2 full,
                   Adafactor its row and column means), each divided by the shards of its
                   `dtensor_layouts.slot_spec` (over `batch` too with shard_optimizer_state);
                   with train.ema_decay, its average too (a copy sharded like the weight)
  activations      one replica's micro-batch (data.batch_size / replicas or the mesh's batch
                   dimension) x what one example keeps for the backward pass: every layer's
                   output plus what MultiHeadAttention keeps inside (query, key and value
                   projections, the [heads, T, S] scores and probabilities), 2 bytes per
                   element under mixed precision, else 4. Their gradients are not counted
                   again: the backward pass makes them a layer at a time and frees each layer's
                   values as it goes (measured: `bench/pipeline.py --schedules` compares the
                   plan with TensorFlow's allocator peak). With recomputation
                   (model.params.remat) each block keeps its output, and one block's
                   activations exist at a time.

Weights and optimizer state are exact: they are what `engine.run_memory` measures on a real
run (tested). Activations are an estimate: XLA fuses some away and adds workspace, a TPU pads
the two minor dimensions of a tensor to 8 and 128, and under DTensor the activations that the
Megatron rules split over `model` are counted whole (an upper bound).

Pipeline stages (`runtime.strategy=pipeline`) are planned one by one, cut as training cuts them
(`pipeline_stages.plan`): each stage's weights, gradients and optimizer state, and the
activations of its own layers for one micro-batch (data.batch_size / runtime.microbatches
examples; grad-accum groups run one after another) times the micro-batches the stage holds at
once under `runtime.pipeline_schedule` (`pipeline_schedule.max_in_flight`: all M under gpipe,
min(S - s, M) on stage s under 1f1b); the device is the stage that needs the most. Under
`interleaved` a stage (device) holds V chunks: their weights, gradients and optimizer state
added, and the most activations its chunks' micro-batches in flight add up to at any point of
the schedule (`pipeline_schedule.peak_held`, each counting its own chunk's layers). With
recomputation the cuts are the plain model's (a recomputed model is cut between blocks only:
close, not equal).

The model is built for its shapes only (in a `tf.Graph`, where variables take no memory), so
a config of billions of parameters plans in seconds. When it does not fit, `suggest` re-plans
the cheapest changes from the same shapes.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools

from tftrain.models.flops import ATTENTION_LAYERS
from tftrain.rules import hardware
from tftrain.models.recompute import BLOCK_NAME
from tftrain.rules.report import ADVICE, ERROR, OK, Finding, Target
from tftrain.runtime import dtensor_layouts, pipeline_schedule

FAMILY = "memory"
GIB = 1 << 30
TIGHT = 0.8  # above this share of the device's memory: advice (workspace and padding on top)
PARTS = ("weights", "compute_copies", "gradients", "optimizer_state", "activations")


@dataclasses.dataclass(frozen=True)
class ModelShapes:
    """What the plan needs of a model: its weights, and the elements one example keeps."""

    weights: tuple  # dtensor_layouts.Weight, by LayoutMap path
    per_example: int  # every layer's outputs (+ attention's insides), one example
    per_example_recomputed: int  # the same with each block recomputed in the backward pass
    unknown_layers: tuple = ()  # layers whose output size is not known (not counted)
    stages: tuple = ()  # StageShapes per pipeline stage (runtime.strategy=pipeline)

    @property
    def parameters(self) -> int:
        return sum(w.size for w in self.weights)


@dataclasses.dataclass(frozen=True)
class StageShapes:
    """One pipeline stage: the paths of its weights and what one example keeps in it."""

    paths: frozenset
    per_example: int
    per_example_recomputed: int


@dataclasses.dataclass
class Plan:
    """One device's bytes by part, against `device_bytes`."""

    target: str
    device_bytes: int | None
    devices: int
    micro_batch: int
    parts: dict
    activations_without_remat: int
    remat: bool
    suggestions: list = dataclasses.field(default_factory=list)
    # pipeline: per stage its parts, "bytes", "schedule" and "microbatches_in_flight"
    stages: list = dataclasses.field(default_factory=list)
    in_flight: int = 0  # pipeline: the micro-batches the device's stage holds at once

    @property
    def bytes_per_device(self) -> int:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.device_bytes is None or self.bytes_per_device <= self.device_bytes

    def to_json(self) -> dict:
        """The plan as `tftrain check --json` writes it under "memory"."""
        return {"target": self.target, "device_bytes": self.device_bytes,
                "devices": self.devices, "micro_batch": self.micro_batch,
                "parts": {**self.parts,
                          "activations_without_remat": self.activations_without_remat},
                "remat": self.remat, "bytes_per_device": self.bytes_per_device,
                "fits": self.fits, "suggestions": self.suggestions,
                **({"stages": self.stages} if self.stages else {})}


def shapes_of(config, build) -> ModelShapes:
    """The shapes of the model `build()` returns, built in a graph (no memory is allocated)."""
    import tensorflow as tf

    from tftrain.runtime import dtensor

    with tf.Graph().as_default():
        model = build(config.model.params)
        weights = tuple(dtensor.weights_of(model))
        per_example, recomputed, unknown = _activation_elements(model)
        stages = _stage_shapes(model, config) if config.runtime.strategy == "pipeline" else ()
    return ModelShapes(weights, per_example, recomputed, tuple(unknown), stages)


def _stage_shapes(model, config) -> tuple:
    """The model cut into stages as training cuts it, and each stage's shapes."""
    from tftrain.runtime import dtensor, pipeline_stages

    owner = {id(v): layer.name for layer in model.layers for v in layer.weights}
    paths = {path: owner[id(v)] for path, v in dtensor.named_variables(model).items()}
    result = []
    for stage in pipeline_stages.plan(model, config.runtime.pipeline_stages,
                                      config.runtime.stage_rules, config.runtime.virtual_stages):
        layers = set(stage.layers)
        per_example, recomputed, _ = _activation_elements(model, layers)
        result.append(StageShapes(frozenset(p for p, name in paths.items() if name in layers),
                                  per_example, recomputed))
    return tuple(result)


def _activation_elements(model, only: set | None = None) -> tuple[int, int, list]:
    """(all, with recomputation, unknown layers) per example: outputs and attention insides
    (of the layers named in `only`, when given)."""
    nodes = [(depth, node) for depth, group in getattr(model, "_nodes_by_depth", {}).items()
             for node in group if only is None or node.layer.name in only]
    total, outside, unknown = 0, 0, []
    blocks: dict[int, list] = {}
    for depth, node in nodes:
        elements, missing = _node_elements(node)
        unknown += missing
        total += elements
        match = BLOCK_NAME.match(node.layer.name)
        if match:
            blocks.setdefault(int(match.group(1)), []).append((depth, elements, node))
        else:
            outside += elements
    kept = outside
    for members in blocks.values():  # a block keeps its output (its shallowest node's)
        kept += _output_elements(min(members, key=lambda m: m[0])[2])
    inside = max((sum(m[1] for m in members) for members in blocks.values()), default=0)
    return total, kept + inside, unknown


def _node_elements(node) -> tuple[int, list]:
    layer = node.layer
    if getattr(layer, "_is_graph_network", False):
        inner, _, unknown = _activation_elements(layer)
        return inner, unknown
    try:
        elements = _output_elements(node)
    except ValueError:
        return 0, [layer.name]
    if type(layer).__name__ in ATTENTION_LAYERS:
        elements += _attention_insides(layer, node)
    return elements, []


def _output_elements(node) -> int:
    import numpy as np

    outputs = node.outputs if isinstance(node.outputs, (list, tuple)) else [node.outputs]
    total = 0
    for output in outputs:
        dims = list(output.shape)[1:]
        if any(d is None for d in dims):
            raise ValueError("unknown size")
        total += int(np.prod(dims, dtype=np.int64))
    return total


def _attention_insides(layer, node) -> int:
    """Query, key and value projections and the scores and probabilities, one example."""
    config = layer.get_config()
    heads, key_dim = config["num_heads"], config["key_dim"]
    value_dim = config.get("value_dim") or key_dim
    inputs = node.input_tensors if isinstance(node.input_tensors, list) else [node.input_tensors]
    queries = int(inputs[0].shape[1])
    keys = int(inputs[-1].shape[1]) if len(inputs) > 1 else queries
    projections = heads * (queries * key_dim + keys * key_dim + keys * value_dim)
    return projections + 2 * heads * queries * keys


def device_bytes(target: Target, gpu_type: str = "") -> int | None:
    """One device's memory: a TPU replica's HBM, a GPU's, this host's RAM (cpu)."""
    from tftrain.host import total_memory

    if target.kind == "tpu":
        generation = hardware.GENERATIONS.get(target.tpu_type)
        return int(generation.hbm_gib * GIB) if generation else None
    if target.kind == "gpu":
        return int(hardware.GPUS[gpu_type or DEFAULT_GPU] * GIB)
    return total_memory()


DEFAULT_GPU = "a100-80gb"


def plan(shapes: ModelShapes, config, target: Target, policy: str,
         gpu_type: str = "") -> Plan:
    """One device's bytes for `config` on `target` (suggestions empty: see `suggest`); for a
    pipeline, the stage that needs the most (each stage's parts in `stages`)."""
    specs, dims, replicas, devices = _layout(shapes, config, target)
    mixed = policy.startswith("mixed_")
    remat = bool(config.model.params.get("remat"))
    name = (f"a {target.tpu_type or 'TPU'} {target.replica_word}" if target.kind == "tpu" else
            f"a {gpu_type or DEFAULT_GPU} GPU" if target.kind == "gpu" else "this host's memory")
    if shapes.stages:  # each stage keeps its micro-batches in flight, as the schedule runs them
        replicas = config.runtime.pipeline_replicas  # each copy runs its share of the batch
        micro = max(config.data.batch_size // (config.runtime.microbatches * replicas), 1)
        stages, without = _stage_parts(shapes, config, (specs, dims), micro, mixed, remat)
        parts, held = max(((p, h) for p, h, _ in stages), key=lambda s: sum(s[0].values()))
        kind, virtual = config.runtime.pipeline_schedule, config.runtime.virtual_stages
        return Plan(name, device_bytes(target, gpu_type), devices, micro, parts, without, remat,
                    stages=[{**p, "bytes": sum(p.values()), "schedule": kind,
                             "microbatches_in_flight": h,
                             **({"chunks": chunks} if virtual > 1 else {})}
                            for p, h, chunks in stages],
                    in_flight=held)
    parts = _weight_parts(shapes.weights, specs, dims, config, mixed)
    micro = max(config.data.batch_size // replicas, 1)
    element = (2 if mixed else 4) * micro
    parts["activations"] = element * (shapes.per_example_recomputed if remat
                                      else shapes.per_example)
    return Plan(name, device_bytes(target, gpu_type), devices, micro, parts,
                element * shapes.per_example, remat)


def _stage_parts(shapes: ModelShapes, config, layout: tuple, micro: int, mixed: bool,
                 remat: bool) -> tuple[list, int]:
    """Per stage (device): its parts (the weights of its chunks, `interleaved`: V of them, and
    the activations of the micro-batches in flight on each chunk at the stage's peak), the
    micro-batches in flight and its chunks; and the most activations any stage would hold
    without recomputation. `layout`: (weight specs, mesh dims); `micro`: a micro-batch's
    examples."""
    runtime, element = config.runtime, (2 if mixed else 4) * micro
    virtual = runtime.virtual_stages
    count = len(shapes.stages) // virtual  # the stages the shapes were cut into
    actions = pipeline_schedule.schedule(runtime.pipeline_schedule, count,
                                         runtime.microbatches, virtual)
    in_flight = pipeline_schedule.max_in_flight(actions, count)

    def peak(attribute: str) -> list:
        return pipeline_schedule.peak_held(actions, count, lambda action: element * getattr(
            shapes.stages[action.chunk(count)], attribute))

    kept = peak("per_example_recomputed" if remat else "per_example")
    stages = []
    for stage in range(count):
        chunks = list(range(stage, count * virtual, count))
        paths = frozenset().union(*(shapes.stages[c].paths for c in chunks))
        parts = _weight_parts([w for w in shapes.weights if w.path in paths], *layout, config,
                              mixed)
        parts["activations"] = int(kept[stage])
        stages.append((parts, in_flight[stage], chunks))
    return stages, int(max(peak("per_example")))


def _weight_parts(weights, specs: dict, dims: dict, config, mixed: bool) -> dict:
    """Weights, compute copies, gradients and optimizer state of `weights` on one device."""
    from tftrain.training.optimizers import slot_shapes

    parts = dict.fromkeys(PARTS, 0)
    for weight in weights:
        spec = specs.get(weight.path)
        pieces = dtensor_layouts.shards(spec, dims)
        parts["weights"] += -(-weight.size * weight.itemsize // pieces)
        parts["compute_copies"] += -(-weight.size * 2 // pieces) if mixed else 0
        if not weight.trainable:
            continue
        accum = 2 if config.train.grad_accum_steps > 1 else 1
        parts["gradients"] += accum * -(-weight.size * 4 // pieces)
        for shape in slot_shapes(config.train.optimizer, weight.shape):
            slot = dtensor_layouts.slot_spec(spec, shape, dims, config.runtime.shard_optimizer_state)
            nbytes = dtensor_layouts.elements(shape) * weight.itemsize
            parts["optimizer_state"] += -(-nbytes // dtensor_layouts.shards(slot, dims))
        if config.train.ema_decay:  # the weight's average (`training.ema`), laid out as it is
            parts["optimizer_state"] += -(-weight.size * weight.itemsize // pieces)
    return parts


def _layout(shapes: ModelShapes, config, target: Target) -> tuple[dict, dict, int, int]:
    """(weight specs, mesh dims, data-parallel replicas, devices) of the config's backend."""
    if config.runtime.strategy == "dtensor":
        dims = dtensor_layouts.parse_mesh(config.runtime.mesh)
        rules = dtensor_layouts.make_rules(config.model.name, config.runtime.layout_rules, dims)
        specs = dtensor_layouts.resolve(shapes.weights, rules, dims)
        return specs, dims, dims[dtensor_layouts.BATCH], dtensor_layouts.mesh_size(dims)
    if config.runtime.strategy == "pipeline":
        return {}, {}, 1, config.runtime.pipeline_stages
    return {}, {}, target.replicas, target.replicas


def suggest(shapes: ModelShapes, config, target: Target, policy: str, found: Plan,
            gpu_type: str = "") -> list[dict]:
    """The changes that make `config` fit, re-planned: single changes first, in the order of
    `_changes` (least disruptive first), then pairs and triples when no single one fits."""
    from tftrain import config as config_lib

    changes = _changes(config, found.devices)
    budget = found.device_bytes
    fitting = []
    for count in (1, 2, 3):
        for combination in itertools.combinations(changes, count):
            override = ",".join(combination)
            try:
                changed = _with_overrides(config, override, config_lib)
                replanned = plan(shapes, changed, target, _policy_of(changed, policy), gpu_type)
            except Exception:  # noqa: BLE001 - a change this config cannot take is no suggestion
                continue
            if budget is None or replanned.bytes_per_device <= budget:
                fitting.append({"override": override,
                                "bytes_per_device": replanned.bytes_per_device})
        if fitting:
            return fitting[:5]
    return []


def _with_overrides(config, override: str, config_lib):
    changed = copy.deepcopy(config)
    config_lib.apply_values(changed, config_lib.parse_overrides(override))
    config_lib.validate(changed)
    return changed


def _policy_of(config, policy: str) -> str:
    mixed = config.runtime.mixed_precision
    return mixed if mixed.startswith("mixed_") else policy


def _changes(config, devices: int) -> list[str]:
    """Candidate overrides, least disruptive first."""
    changes = []
    params, train, runtime = config.model.params, config.train, config.runtime
    if config.model.name in ("transformer", "transformer_lm") and not params.get("remat"):
        changes.append("model.params.remat=true" + (
            ",model.params.dropout=0" if params.get("dropout") else ""))
    if train.optimizer != "adafactor":
        changes.append("train.optimizer=adafactor")
    dtensor = runtime.strategy == "dtensor"
    if dtensor and not runtime.shard_optimizer_state:
        changes.append("runtime.shard_optimizer_state=true")
    if not dtensor and not runtime.mixed_precision.startswith("mixed_"):
        changes.append("runtime.mixed_precision=mixed_bfloat16")
    batch = config.data.batch_size
    for k in (2, 4, 8):
        if not dtensor and batch % k == 0 and batch // k >= 1:
            changes.append(f"data.batch_size={batch // k},train.grad_accum_steps="
                           f"{train.grad_accum_steps * k}")
    if runtime.strategy == "pipeline":  # more stages (devices), each holding less of the model
        changes += [f"runtime.pipeline_stages={runtime.pipeline_stages * k}" for k in (2, 4)]
        return _schedule_changes(config) + changes
    current = (dtensor_layouts.parse_mesh(runtime.mesh)[dtensor_layouts.MODEL]
               if dtensor else 1)
    for model in (m for m in (2, 4, 8, 16) if current < m <= devices and devices % m == 0):
        if batch % (devices // model) == 0:
            changes.append(f"runtime.strategy=dtensor,runtime.mesh='batch:{devices // model},"
                           f"model:{model}'")
    return changes


def _schedule_changes(config) -> list[str]:
    """Pipeline changes that cost no step time, first: 1f1b (at most S - s micro-batches in
    flight on stage s, where gpipe holds all M; not from interleaved, whose bubble is smaller)
    and more, smaller micro-batches (under 1f1b a stage still holds at most S - s of them; the
    bubble shrinks too)."""
    runtime, batch = config.runtime, config.data.batch_size
    changes = ([] if runtime.pipeline_schedule in ("1f1b", "interleaved") else
               ["runtime.pipeline_schedule=1f1b"])
    return changes + [f"runtime.microbatches={runtime.microbatches * k}" for k in (2, 4)
                      if batch % (runtime.microbatches * k) == 0]


def _activations_held(found: Plan) -> str:
    """'activations of 64 examples', or a pipeline stage's micro-batches in flight."""
    if not found.stages:
        return f"activations of {found.micro_batch} examples"
    each = f"of {found.micro_batch} examples "
    return f"activations of {_in_flight(found.in_flight, found.stages[0]['schedule'], each)}"


def _in_flight(held: int, kind: str, each: str = "") -> str:
    """'2 micro-batches in flight (1f1b)', with `each` ('of 8 examples ') before 'in flight'."""
    return f"{held} micro-batch{'es' if held != 1 else ''} {each}in flight ({kind})"


def _per_stage(found: Plan) -> str:
    """'; stage 0: ~1.2 MiB, activations of 2 micro-batches in flight (1f1b) 0.4 MiB; ...'"""
    return "".join(f"; stage {i}: ~{size(stage['bytes'])}, activations of "
                   f"{_in_flight(stage['microbatches_in_flight'], stage['schedule'])} "
                   f"{size(stage['activations'])}" for i, stage in enumerate(found.stages))


def check(found: Plan, shapes: ModelShapes) -> Finding:
    """The plan against the device's memory: ok, advice when tight, error when it does not fit
    (with the suggestions that would)."""
    parts = found.parts
    text = (f"~{size(found.bytes_per_device)} per device ({found.devices} device"
            f"{'s' if found.devices != 1 else ''}): weights {size(parts['weights'])}"
            + (f" + compute copies {size(parts['compute_copies'])}"
               if parts["compute_copies"] else "")
            + f" + gradients {size(parts['gradients'])} + optimizer state "
            f"{size(parts['optimizer_state'])} + {_activations_held(found)} "
            f"{size(parts['activations'])}"
            + (f" (recomputed; {size(found.activations_without_remat)} without)"
               if found.remat else "")
            + f", {shapes.parameters:,} parameters")
    if shapes.unknown_layers:
        text += (f"; output sizes unknown for {', '.join(shapes.unknown_layers[:3])} "
                 "(not counted)")
    stages = _per_stage(found)
    if found.device_bytes is None:
        return Finding(OK, FAMILY, f"planned {text}{stages}")
    against = f"{text}, of the {size(found.device_bytes)} of {found.target}"
    fixes = "; ".join(f"--params_override=\"{s['override']}\" "
                      f"(~{size(s['bytes_per_device'])})" for s in found.suggestions)
    if not found.fits:
        return Finding(ERROR, FAMILY, f"does not fit: {against}{stages}",
                       fixes or "no single change of batch, precision, optimizer, "
                       "recomputation or mesh fits: more devices or a larger device")
    if found.bytes_per_device > TIGHT * found.device_bytes:
        return Finding(ADVICE, FAMILY, f"tight: {against} (workspace and padding come on "
                       f"top){stages}", fixes or "leave room: a smaller data.batch_size")
    return Finding(OK, FAMILY, f"fits: {against}{stages}")


def size(nbytes: float) -> str:
    """'1.25 GiB', '3.4 MiB' or '12 KiB'."""
    if nbytes >= GIB:
        return f"{nbytes / GIB:.2f} GiB"
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.1f} MiB"
    return f"{nbytes / 1024:.0f} KiB"

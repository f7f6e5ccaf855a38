"""A functional model cut by layers into pipeline stages, each rebuilt on its own device.

The model's layers are taken in the order of its config (topological). After each layer, the
tensors still needed later are the *boundary* there; a cut is allowed where the boundary holds
exactly one tensor that depends on weights (the activation), plus any weight-free tensors
computed from the inputs (an attention mask, positions), which are cheap to pass along. A
ResNet can therefore be cut between residual blocks but not inside one (the shortcut and the
branch would both cross), a Transformer between and inside blocks at its residual adds.

Cuts are chosen to balance the stages' parameter bytes (weights, and with them gradients and
optimizer state, are what a stage must hold; activations depend on the batch and are planned
by `tftrain check`), or named by `runtime.stage_rules` (the layers after which to cut).

Each stage is a functional model rebuilt from the original's layer configs, with an
`InputLayer` named after each tensor that crosses into it, built under `tf.device(device)` so
its variables live there; `copy_weights` moves weights between the original and the stages by
layer name.
"""
from __future__ import annotations

import dataclasses

from tftrain.errors import ConfigError
from tftrain.models import attention


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage: its layers (by name, in order), the tensors it receives and the ones it
    passes on (each named by the layer that produces it)."""

    layers: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    parameters: int


def _references(value) -> list[str]:
    """The layer names of the tensors an inbound-node entry refers to (`[name, node, tensor]`
    triples, nested anywhere in it, keyword arguments included)."""
    if isinstance(value, (list, tuple)):
        if (len(value) in (3, 4) and isinstance(value[0], str) and isinstance(value[1], int)
                and isinstance(value[2], int)):
            if value[1] or value[2]:
                raise ConfigError(f"layer {value[0]!r} is called more than once or returns "
                                  "several tensors: runtime.strategy=pipeline cuts models whose "
                                  "layers are each called once with one output")
            extra = value[3] if len(value) == 4 else {}
            return [value[0], *_references(extra)]
        return [name for item in value for name in _references(item)]
    if isinstance(value, dict):
        return [name for item in value.values() for name in _references(item)]
    return []


@dataclasses.dataclass
class Graph:
    """The model's layers in order, what each one reads, and where each is last read."""

    names: list[str]
    reads: dict[str, list[str]]
    outputs: list[str]
    parameters: dict[str, int]
    weighted: set[str]  # tensors that depend on some weight
    last_read: dict[str, int] = dataclasses.field(default_factory=dict)  # position; past the end: an output

    @classmethod
    def of(cls, model) -> "Graph":
        config = model.get_config()
        if "layers" not in config or "output_layers" not in config:
            raise ConfigError(f"model {model.name!r} is not a functional tf_keras model: "
                              "runtime.strategy=pipeline cuts functional models by their layers")
        names = [layer["name"] for layer in config["layers"]]
        reads = {layer["name"]: list(dict.fromkeys(_references(layer["inbound_nodes"])))
                 for layer in config["layers"]}
        outputs = [name for name in _references(config["output_layers"])]
        parameters = {name: model.get_layer(name).count_params() for name in names}
        weighted: set[str] = set()
        position_of = {name: position for position, name in enumerate(names)}
        last_read = {name: len(names) for name in outputs}
        for position, name in enumerate(names):
            for read in reads[name]:
                last_read[read] = max(last_read.get(read, -1), position)
            if any(position_of.get(read, len(names)) >= position for read in reads[name]):
                raise ConfigError(f"layer {name!r} reads a later layer: the model's layers are "
                                  "not in topological order")
            if parameters[name] or any(read in weighted for read in reads[name]):
                weighted.add(name)
        return cls(names, reads, outputs, parameters, weighted, last_read)

    def boundary(self, position: int) -> list[str]:
        """The tensors produced at or before `position` that a later layer (or the output)
        reads."""
        return [name for name in self.names[:position + 1]
                if self.last_read.get(name, -1) > position]

    def cuttable(self, position: int) -> bool:
        """Whether a cut after `position` passes one activation (plus weight-free tensors)."""
        crossing = self.boundary(position)
        return sum(name in self.weighted for name in crossing) == 1

    def candidates(self) -> list[int]:
        """Positions after which a cut is allowed, each leaving weights on both sides."""
        total = sum(self.parameters.values())
        result, before = [], 0
        for position, name in enumerate(self.names[:-1]):
            before += self.parameters[name]
            if 0 < before < total and self.cuttable(position):
                result.append(position)
        return result


def _balanced(graph: Graph, candidates: list[int], count: int) -> list[int]:
    """`count - 1` cut positions among `candidates` minimizing the largest stage's parameters
    (dynamic programming over the candidates)."""
    prefix, running = [], 0
    for name in graph.names:
        running += graph.parameters[name]
        prefix.append(running)
    total = running
    points = [-1, *candidates, len(graph.names) - 1]

    def size(a: int, b: int) -> int:  # parameters in (points[a], points[b]]
        return prefix[points[b]] - (prefix[points[a]] if points[a] >= 0 else 0)

    last = len(points) - 1
    # best[k][j]: the smallest largest stage when the first k stages end at points[j]
    best = {(0, 0): (0, None)}
    for k in range(1, count + 1):
        for j in range(1, last + 1):
            options = [(max(best[(k - 1, i)][0], size(i, j)), i) for i in range(j)
                       if (k - 1, i) in best and size(i, j) > 0]
            if options and (k < count or j == last):
                best[(k, j)] = min(options)
    if (count, last) not in best or total == 0:
        return []
    cuts, j = [], last
    for k in range(count, 0, -1):
        j = best[(k, j)][1]
        cuts.append(points[j])
    return sorted(cuts)[1:]


def plan(model, count: int, rules: str = "", virtual: int = 1) -> list[Stage]:
    """The model cut into `count` stages (x `virtual` chunks each, `interleaved`: `count` x
    `virtual` parts in model order): after the layers `rules` names (comma-separated), else
    balanced by parameter bytes. ConfigError, in one line, when it cannot be cut so."""
    graph = Graph.of(model)
    what = f"runtime.pipeline_stages={count}"
    if virtual > 1:
        count *= virtual
        what += f" x runtime.virtual_stages={virtual} = {count} chunks"
    noun = "chunks" if virtual > 1 else "stages"
    candidates = graph.candidates()
    if rules:
        named = [name.strip() for name in rules.split(",") if name.strip()]
        cuts = []
        for name in named:
            position = graph.names.index(name) if name in graph.names else None
            if position not in candidates:
                allowed = ", ".join(graph.names[p] for p in candidates[:8])
                raise ConfigError(f"runtime.stage_rules names {name!r}, which is not a layer "
                                  f"after which {model.name!r} passes one activation; cut after "
                                  f"one of: {allowed}{' ...' if len(candidates) > 8 else ''}")
            cuts.append(position)
        if len(cuts) != count - 1 or cuts != sorted(set(cuts)):
            raise ConfigError(f"runtime.stage_rules must name {count - 1} distinct layers in "
                              f"model order for {what}; got {named}")
    else:
        cuts = _balanced(graph, candidates, count)
        if len(cuts) != count - 1:
            raise ConfigError(
                f"model {model.name!r} cannot be cut into {what}{' stages' * (virtual == 1)}"
                f" that each hold weights: it has {len(candidates)} place(s) where one "
                f"activation alone crosses between its layers; use fewer {noun}")
    return _stages(graph, cuts)


def _stages(graph: Graph, cuts: list[int]) -> list[Stage]:
    """The stages between consecutive cuts."""
    bounds = [-1, *cuts, len(graph.names) - 1]
    stages = []
    for start, end in zip(bounds, bounds[1:]):
        layers = tuple(graph.names[start + 1:end + 1])
        inputs = tuple(graph.boundary(start)) if start >= 0 else ()
        outputs = tuple(graph.boundary(end)) if end < len(graph.names) - 1 else tuple(graph.outputs)
        stages.append(Stage(layers, inputs, outputs,
                            sum(graph.parameters[name] for name in layers)))
    return stages


def _stage_config(model, stage: Stage, index: int) -> dict:
    """The functional config of `stage`: an InputLayer per crossing tensor, then its layers."""
    import tf_keras as keras

    layers = {layer["name"]: layer for layer in model.get_config()["layers"]}
    inputs = []
    for name in stage.inputs:
        tensor = model.get_layer(name).output
        inputs.append({"class_name": "InputLayer", "name": name, "inbound_nodes": [],
                       "config": {"batch_input_shape": tuple(tensor.shape), "name": name,
                                  "dtype": tensor.dtype.name, "sparse": False, "ragged": False}})
    first_inputs = [name for name in stage.layers
                    if isinstance(model.get_layer(name), keras.layers.InputLayer)]
    return {"name": f"{model.name}_stage_{index}",
            "layers": inputs + [layers[name] for name in stage.layers],
            "input_layers": [[name, 0, 0] for name in (stage.inputs or tuple(first_inputs))],
            "output_layers": [[name, 0, 0] for name in stage.outputs]}


def build(model, stages: list[Stage], devices: list[str]) -> list:
    """Each stage as a functional model whose variables are created on its device, holding
    the weights of `model`. R x S `devices` (`devices()` with `runtime.pipeline_replicas`)
    build R copies of the pipeline, in device order: replica r's stage s on device r * S + s."""
    import tensorflow as tf

    if len(devices) % len(stages):
        raise ValueError(f"{len(devices)} devices do not hold copies of {len(stages)} stages")
    built = []
    for position, device in enumerate(devices):
        index = position % len(stages)
        with tf.device(device):
            # the model's own class: a recomputed model's stages are recomputed too
            part = type(model).from_config(_stage_config(model, stages[index], index),
                                           custom_objects=attention.staged_classes())
        built.append(part)
    copy_weights(model, built)
    return built


def chunk_devices(devices: list[str], stages: int, virtual: int) -> list[str]:
    """The device of each chunk of each replica (`interleaved`): of R x S `devices`, replica
    r's chunk c (of S x `virtual`) on device r * S + c % S; `virtual` = 1 gives `devices`."""
    return [devices[start + chunk % stages] for start in range(0, len(devices), stages)
            for chunk in range(stages * virtual)]


def copy_weights(source, targets) -> None:
    """Every layer of the `targets` models gets the weights of the layer of the same name in
    `source` (the way back, stages into one model, is `gather`)."""
    for target in targets:
        for layer in target.layers:
            if layer.weights:
                layer.set_weights(source.get_layer(layer.name).get_weights())


def gather(stages, model) -> None:
    """The stages' trained weights copied into `model`, layer by layer."""
    owners = {layer.name: layer for stage in stages for layer in stage.layers if layer.weights}
    for layer in model.layers:
        if layer.weights:
            layer.set_weights(owners[layer.name].get_weights())


def devices(runtime) -> list[str]:
    """One device per stage of each replica (`runtime.pipeline_replicas` copies of the
    pipeline; stage s of replica r on device r * S + s): this host's GPUs when it has enough,
    else virtual CPU devices (`runtime.cpu_devices`, raised to that number). Call before
    TensorFlow starts."""
    import tensorflow as tf
    from absl import logging

    from tftrain.runtime import distribute

    stages, replicas = runtime.pipeline_stages, runtime.pipeline_replicas
    count = stages * replicas
    if runtime.tpu:
        raise ConfigError("runtime.strategy=pipeline places stages with tf.device on GPUs or "
                          "CPUs; TPU cores are driven through TPUStrategy or DTensor, which "
                          "compile a whole step for every core: use runtime.strategy=tpu or "
                          "dtensor on a TPU")
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if len(gpus) < count:
            if replicas == 1:
                raise ConfigError(f"runtime.pipeline_stages={count} needs {count} GPUs; this "
                                  f"host has {len(gpus)}: use at most {len(gpus)} stages")
            raise ConfigError(f"runtime.pipeline_stages={stages} x runtime.pipeline_replicas="
                              f"{replicas} needs {count} GPUs; this host has {len(gpus)}: "
                              f"make stages x replicas at most {len(gpus)}")
        return [f"/device:GPU:{index}" for index in range(count)]
    cpus = max(runtime.cpu_devices, count)
    if runtime.cpu_devices < count:
        logging.info("no GPU: %d stages x %d replicas on %d virtual CPU devices", stages,
                     replicas, cpus)
    distribute.configure_cpu_devices(cpus)
    return [f"/device:CPU:{index}" for index in range(count)]

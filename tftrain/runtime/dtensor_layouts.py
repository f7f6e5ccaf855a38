"""DTensor mesh and layout rules: which weight is split over which mesh dimension.

A mesh is written `batch:2,model:2`: the `batch` dimension splits each global batch (data
parallelism), the `model` dimension splits weights (model parallelism). A layout rule maps a
regex on a weight's path (`<layer name>.<attribute>`, e.g. `dense_1.kernel`, the path that
tf-keras's `LayoutMap` uses) to a sharding spec with one entry per weight dimension, each
`unsharded` or a mesh dimension name: `{"dense.*kernel": "unsharded,model"}`.

Rules are tried in order, the user's (`runtime.layout_rules`) before the model's defaults; the
first rule whose regex matches the start of a path decides that weight (a default rule whose
spec does not fit the weight's shape gives way to the next one that does). Weights that no rule
matches are replicated. This module does not import TensorFlow: the config is checked with it
before TensorFlow starts, and the rules are resolved against the weights of a built model.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Iterable

from tftrain.errors import ConfigError

BATCH = "batch"  # the mesh dimension that splits the data
MODEL = "model"  # the mesh dimension that splits the weights
UNSHARDED = "unsharded"

# DTensor in TF 2.21 cannot shard convolutions: its Conv SPMD expander requires a fully replicated
# filter ("Filter for convolution must have fully replicated layout"), and a sharded conv bias
# pushes a channel-sharded layout onto the conv output, which the expander cannot produce.
CONV_LAYERS = ("Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose",
               "Conv3DTranspose", "DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D",
               "SeparableConv2D")

# Default rules for the registry's models. Hidden Dense layers are split by output units
# (column parallel: kernel [in, out/model], bias [out/model]); the logits layer is split by its
# input units (row parallel), so the number of classes need not divide the mesh. Conv and
# BatchNormalization weights stay replicated (see CONV_LAYERS); Embedding tables split by width.
DEFAULT_RULES: dict[str, dict[str, str | list[str]]] = {
    "mlp": {r"dense(_\d+)?\.kernel$": "unsharded,model", r"dense(_\d+)?\.bias$": "model",
            r"logits\.kernel$": "model,unsharded"},
    "cnn": {r"dense(_\d+)?\.kernel$": "unsharded,model", r"dense(_\d+)?\.bias$": "model",
            r"logits\.kernel$": "model,unsharded"},
    "resnet": {r"logits\.kernel$": "model,unsharded"},
}
# Megatron-style rules for the Transformers (tftrain.models.transformer). Each block needs two
# all-reduces over `model` and no more: attention's query/key/value kernels [width, heads,
# head_width] are split by heads (each device attends with its own heads), the output projection
# [heads, head_width, width] by its input (heads) dimension; the MLP's first kernel by columns,
# its second by rows. Embeddings are split by width (a recomputed model has the same weight
# paths). A default rule may list specs: the first that fits the weight decides (`resolve`).
_TRANSFORMER_RULES = {
    r"block_\d+_attention\._(query|key|value)_dense\.kernel$": "unsharded,model,unsharded",
    r"block_\d+_attention\._(query|key|value)_dense\.bias$": "model,unsharded",
    r"block_\d+_attention\._output_dense\.kernel$": "model,unsharded,unsharded",
    r"block_\d+_mlp_in\.kernel$": "unsharded,model",
    r"block_\d+_mlp_in\.bias$": "model",
    r"block_\d+_mlp_out\.kernel$": "model,unsharded",
    r"(token|position)_embedding\.embeddings$": "unsharded,model",
    # by vocabulary (or classes) if it divides by `model`, else by the input width
    r"logits\.kernel$": ["unsharded,model", "model,unsharded"],
    r"logits\.bias$": ["model", "unsharded"],
}
DEFAULT_RULES["transformer"] = DEFAULT_RULES["transformer_lm"] = _TRANSFORMER_RULES
GENERIC_RULES = {  # for user models (package.module:function)
    r"dense(_\d+)?\.kernel$": "unsharded,model", r"dense(_\d+)?\.bias$": "model",
    r"embedding(_\d+)?\.embeddings$": "unsharded,model",
}


@dataclasses.dataclass(frozen=True)
class Weight:
    """One weight of a built model: its LayoutMap path, shape, dtype size and layer class."""

    path: str
    shape: tuple
    layer_class: str = ""
    itemsize: int = 4
    trainable: bool = True

    @property
    def size(self) -> int:
        """Number of elements."""
        count = 1
        for dim in self.shape:
            count *= int(dim)
        return count


@dataclasses.dataclass(frozen=True)
class Rule:
    """A regex on weight paths, its sharding spec, and where it came from (for messages)."""

    pattern: str
    spec: tuple
    source: str  # "runtime.layout_rules" or "default rules of model X"


def parse_mesh(text: str) -> dict[str, int]:
    """'batch:2,model:2' -> {'batch': 2, 'model': 2}; both dimensions are required."""
    if not text or not text.strip():
        raise ConfigError("runtime.strategy=dtensor needs runtime.mesh (or --mesh), e.g. "
                          "--mesh=batch:2,model:2 (batch splits the data, model splits the "
                          "weights)")
    mesh: dict[str, int] = {}
    for item in text.split(","):
        name, sep, size = item.strip().partition(":")
        name = name.strip()
        if not sep or not size.strip().isdigit() or int(size) < 1:
            raise ConfigError(f"runtime.mesh={text!r}: bad entry {item.strip()!r}; write "
                              "NAME:SIZE pairs with sizes >= 1, e.g. batch:2,model:2")
        if name not in (BATCH, MODEL):
            raise ConfigError(f"runtime.mesh={text!r}: unknown dimension {name!r}; the mesh has "
                              f"two dimensions, {BATCH} (splits the data) and {MODEL} (splits "
                              "the weights)")
        if name in mesh:
            raise ConfigError(f"runtime.mesh={text!r}: dimension {name!r} is given twice")
        mesh[name] = int(size)
    for name in (BATCH, MODEL):
        mesh.setdefault(name, 1)
    return {BATCH: mesh[BATCH], MODEL: mesh[MODEL]}


def mesh_size(mesh: dict[str, int]) -> int:
    """The number of devices the mesh needs."""
    return mesh[BATCH] * mesh[MODEL]


def format_mesh(mesh: dict[str, int]) -> str:
    """{'batch': 2, 'model': 2} -> 'batch:2,model:2'."""
    return ",".join(f"{name}:{size}" for name, size in mesh.items())


def parse_spec(text: str, mesh: dict[str, int], where: str) -> tuple:
    """'unsharded,model' -> ('unsharded', 'model'), each entry checked against the mesh."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{where}: sharding spec {text!r} must be a string such as "
                          "'unsharded,model' (one entry per weight dimension)")
    spec = tuple(part.strip() for part in text.split(","))
    for part in spec:
        if part != UNSHARDED and part not in mesh:
            raise ConfigError(f"{where}: sharding spec {text!r} has {part!r}; each entry must be "
                              f"{UNSHARDED} or a mesh dimension ({', '.join(mesh)})")
    sharded = [part for part in spec if part != UNSHARDED]
    if len(sharded) != len(set(sharded)):
        raise ConfigError(f"{where}: sharding spec {text!r} uses a mesh dimension twice")
    return spec


def make_rules(model_name: str, user_rules: dict, mesh: dict[str, int]) -> list[Rule]:
    """The user's rules (checked), then the model's default rules, in matching order."""
    if not isinstance(user_rules, dict):
        raise ConfigError(f"runtime.layout_rules must be a mapping of regex -> spec, "
                          f"got {user_rules!r}")
    rules = []
    for pattern, text in user_rules.items():
        where = f"runtime.layout_rules[{pattern!r}]"
        try:
            re.compile(pattern)
        except re.error as e:
            raise ConfigError(f"{where}: {pattern!r} is not a valid regex ({e})") from None
        rules.append(Rule(pattern, parse_spec(text, mesh, where), "runtime.layout_rules"))
    defaults = DEFAULT_RULES.get(model_name, GENERIC_RULES)
    for pattern, texts in defaults.items():
        for text in [texts] if isinstance(texts, str) else texts:
            rules.append(Rule(pattern, parse_spec(text, mesh, "default rules"),
                              f"default rules of model {model_name!r}"))
    return rules


def _fits(weight: Weight, spec: tuple, mesh: dict[str, int]) -> bool:
    """Whether `spec` has the weight's rank and every sharded dimension divides."""
    return len(spec) == len(weight.shape) and all(
        part == UNSHARDED or int(dim) % mesh[part] == 0 for dim, part in zip(weight.shape, spec))


def check_config(config) -> None:
    """Config-time checks of a dtensor run (no TensorFlow): mesh, devices, batch, rules."""
    runtime, batch_size = config.runtime, config.data.batch_size
    mesh = parse_mesh(runtime.mesh)
    if runtime.cpu_devices and runtime.cpu_devices != mesh_size(mesh):
        raise ConfigError(f"runtime.mesh={runtime.mesh!r} needs {mesh_size(mesh)} devices but "
                          f"runtime.cpu_devices={runtime.cpu_devices}; set runtime.cpu_devices="
                          f"{mesh_size(mesh)} or 0 (0: split the CPU to fit the mesh)")
    if batch_size % mesh[BATCH]:
        lower = batch_size - batch_size % mesh[BATCH]
        raise ConfigError(f"data.batch_size ({batch_size}) must be divisible by the mesh's batch "
                          f"dimension ({mesh[BATCH]} in runtime.mesh={runtime.mesh!r}); use "
                          f"{lower or mesh[BATCH]} or {lower + mesh[BATCH]}")
    if runtime.mixed_precision not in ("float32", "auto"):
        raise ConfigError(f"runtime.strategy=dtensor trains in float32 only; got runtime."
                          f"mixed_precision={runtime.mixed_precision!r} (use float32)")
    if getattr(runtime, "jit_compile", "auto") == "true":
        raise ConfigError("runtime.strategy=dtensor does not compile its steps with XLA here "
                          "(runtime.jit_compile=true); use runtime.jit_compile=auto or false")
    accum = getattr(config.train, "grad_accum_steps", 1)
    if accum > 1:
        raise ConfigError(f"runtime.strategy=dtensor does not accumulate gradients; got "
                          f"train.grad_accum_steps={accum} (use 1 and a larger data.batch_size)")
    make_rules(config.model.name, runtime.layout_rules, mesh)


def resolve(weights: Iterable[Weight], rules: list[Rule], mesh: dict[str, int]) -> dict[str, tuple]:
    """Decides the sharding spec of every weight; returns {path: spec} for the sharded ones.

    A default rule whose spec does not fit a weight (rank, divisibility) gives way to the next
    matching rule that fits.
    Raises ConfigError naming the rule and the weight when a user rule matches no weight, when a
    spec's length differs from the weight's rank, when a sharded dimension does not divide by its
    mesh dimension, or when a rule shards a convolution (impossible in DTensor on TF 2.21).
    """
    weights = list(weights)
    used = set()
    plan: dict[str, tuple] = {}
    for weight in weights:
        # A default rule that does not fit the weight gives way to the next matching rule that
        # does; when none does, the first matching rule decides (and its error is raised).
        matching = [r for r in rules if re.match(r.pattern, weight.path)]
        rule = next((r for r in matching if r.source == "runtime.layout_rules"
                     or _fits(weight, r.spec, mesh)), matching[0] if matching else None)
        if rule is None:
            continue
        used.add(rule)
        spec = rule.spec
        if all(part == UNSHARDED for part in spec) and len(spec) == len(weight.shape):
            continue
        where = f"{rule.source} {rule.pattern!r} -> {','.join(spec)!r}"
        if len(spec) != len(weight.shape):
            raise ConfigError(f"{where} matches weight {weight.path} of shape {list(weight.shape)} "
                              f"(rank {len(weight.shape)}), but the spec has {len(spec)} entries; "
                              "give one entry per dimension")
        if weight.layer_class in CONV_LAYERS:
            raise ConfigError(
                f"{where} shards weight {weight.path} of {weight.layer_class} layer, but DTensor "
                "in TensorFlow 2.21 cannot shard convolutions (its Conv expander requires a "
                "replicated filter and output channels); leave conv weights unsharded")
        for axis, (dim, part) in enumerate(zip(weight.shape, spec)):
            if part != UNSHARDED and int(dim) % mesh[part]:
                raise ConfigError(
                    f"{where}: dimension {axis} of weight {weight.path} (shape "
                    f"{list(weight.shape)}) has size {dim}, which does not divide by mesh "
                    f"dimension {part}={mesh[part]} (runtime.mesh={format_mesh(mesh)}); change the "
                    "rule, the layer's size, or the mesh")
        plan[weight.path] = spec
    for rule in rules:
        if rule.source == "runtime.layout_rules" and rule not in used:
            paths = ", ".join(w.path for w in weights[:12]) + (", ..." if len(weights) > 12 else "")
            raise ConfigError(f"runtime.layout_rules: rule {rule.pattern!r} -> "
                              f"{','.join(rule.spec)!r} matches no weight (or only weights that an "
                              f"earlier rule decides); the model's weights are: {paths}")
    return plan


def shards(spec: tuple | None, mesh: dict[str, int]) -> int:
    """Into how many pieces a weight with `spec` is split (1 when replicated)."""
    count = 1
    for part in spec or ():
        if part != UNSHARDED:
            count *= mesh[part]
    return count


def slot_spec(weight_spec: tuple | None, slot_shape: tuple, mesh: dict[str, int],
              shard_state: bool) -> tuple:
    """The sharding spec of an optimizer slot of shape `slot_shape` for a weight laid out as
    `weight_spec` (None: replicated). A slot of the weight's own shape takes the weight's
    spec; a factored one (Adafactor's row and column means) starts replicated. With
    `shard_state` (runtime.shard_optimizer_state, ZeRO-1) its first unsharded dimension that
    the mesh's batch dimension divides is split over `batch` too, so each data-parallel replica
    keeps 1/batch of it; a slot with no such dimension stays as it was."""
    rank = len(slot_shape)
    if weight_spec is not None and len(weight_spec) == rank:
        spec = list(weight_spec)
    else:
        spec = [UNSHARDED] * rank
    if shard_state and mesh.get(BATCH, 1) > 1 and BATCH not in spec:
        for axis, size in enumerate(slot_shape):
            if spec[axis] == UNSHARDED and size % mesh[BATCH] == 0:
                spec[axis] = BATCH
                break
    return tuple(spec)


def memory_report(weights: Iterable[Weight], plan: dict[str, tuple], mesh: dict[str, int],
                  optimizer: str = "adam", shard_state: bool = False,
                  ema: bool = False) -> dict:
    """Bytes of the weights and of `optimizer`'s state on one device vs the largest per device
    of the mesh: each weight divided by its shards, each optimizer slot (`slot_shapes`) by the
    shards of its `slot_spec` (over `batch` too with `shard_state`), rounded up per variable as
    the devices hold them; with `ema` (train.ema_decay), each trainable weight's average too,
    sharded as the weight is. Activations and gradients are not counted."""
    from tftrain.training.optimizers import optimizer_slots, slot_shapes  # after TensorFlow

    one = weights_per_device = state_per_device = 0
    sharded = replicated = 0
    for weight in weights:
        spec = plan.get(weight.path)
        nbytes = weight.size * weight.itemsize
        pieces = shards(spec, mesh)
        weights_per_device += -(-nbytes // pieces)
        one += nbytes
        for shape in slot_shapes(optimizer, weight.shape) if weight.trainable else ():
            slot_bytes = elements(shape) * weight.itemsize
            one += slot_bytes
            state_per_device += -(-slot_bytes // shards(
                slot_spec(spec, shape, mesh, shard_state), mesh))
        if ema and weight.trainable:
            one += nbytes
            state_per_device += -(-nbytes // pieces)
        if pieces > 1:
            sharded += weight.size
        else:
            replicated += weight.size
    per_device = weights_per_device + state_per_device
    return {"mesh": format_mesh(mesh), "optimizer": optimizer,
            "optimizer_slots": optimizer_slots(optimizer), "shard_optimizer_state": shard_state,
            "bytes_one_device": one, "bytes_per_device": per_device,
            "weights_bytes_per_device": weights_per_device,
            "optimizer_bytes_per_device": state_per_device,
            "per_device_fraction": per_device / one if one else 1.0,
            "sharded_params": sharded, "replicated_params": replicated}


def elements(shape: tuple) -> int:
    """Number of elements of `shape`."""
    count = 1
    for dim in shape:
        count *= int(dim)
    return count

"""Input pipeline: Python functions a TPU host cannot run, and shapes XLA cannot compile.

Python functions: `tf.py_function` (op `EagerPyFunc`), `tf.numpy_function` (`PyFunc`,
`PyFuncStateless`) and `Dataset.from_generator` (`GeneratorDataset`) call back into the Python
process that built the pipeline. On a Cloud TPU VM that process runs the pipeline, so they work,
under the GIL (one thread for the whole pipeline, often what starves a TPU); the hosts of a TPU
node or pod reached by name or grpc://, and tf.data service workers, have no such process, so
there they fail. `graph_python_ops` finds them in the dataset's graph (every function in its
library, so a Python call inside `map` is found and named by the `map` it is in) without running
anything; `source_python_calls` finds them in a pipeline's `decode` source, with no TensorFlow at
all (the check that runs before connecting to a TPU).

Static shapes: XLA compiles one program for one input shape, so every TPU training input must
be a dense tensor of fully known shape, batch dimension included (`drop_remainder=True`).
"""
from __future__ import annotations

import inspect
import re
import warnings

from tftrain.rules.report import ADVICE, ERROR, OK, Finding, Target

FAMILY = "input"
PYTHON_OPS = {"EagerPyFunc": "tf.py_function", "PyFunc": "tf.numpy_function",
              "PyFuncStateless": "tf.numpy_function", "GeneratorDataset": "Dataset.from_generator"}
PYTHON_CALLS = ("py_function", "numpy_function", "py_func", "from_generator")
_DATASET_FUNCTION = re.compile(r"^__inference_Dataset_(\w+)_\d+$")
_DATASET_METHODS = ("flat_map", "interleave", "map", "filter", "scan", "reduce", "batch")
_GENERATOR_FUNCTIONS = "__inference_Dataset_from_generator_"  # the generator's own calls


# -- Python functions in the pipeline ---------------------------------------------------------

def graph_python_ops(build_dataset) -> list[tuple[str, str]]:
    """(op, where) for each Python-calling op in the dataset that `build_dataset()` returns.

    The dataset is built in a throwaway `tf.Graph` and read from its GraphDef: nothing runs.
    (Tracing its functions still starts TensorFlow's eager context, so this is for after the
    strategy exists, or for `tftrain check`, which never connects to a TPU.)
    """
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default(), warnings.catch_warnings():
        # tf.data warns that options read in graph mode may be stale: none is read here.
        warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")
        build_dataset()
    graph_def = graph.as_graph_def()
    functions = {f.signature.name: f for f in graph_def.library.function}
    callers: dict[str, set] = {}
    for name, function in functions.items():
        for callee in _callees(function.node_def, functions):
            callers.setdefault(callee, set()).add(name)
    found = [(node.op, "Dataset.from_generator" if node.op == "GeneratorDataset" else "the graph")
             for node in graph_def.node if node.op in PYTHON_OPS]
    for name, function in functions.items():
        for node in function.node_def:
            if node.op == "GeneratorDataset":
                found.append((node.op, "Dataset.from_generator"))
            elif node.op in PYTHON_OPS and not name.startswith(_GENERATOR_FUNCTIONS):
                found.append((node.op, _where(name, callers)))
    return sorted(set(found))


def _callees(nodes, functions) -> set:
    names = set()
    for node in nodes:
        if node.op in functions:
            names.add(node.op)
        for value in node.attr.values():
            if value.HasField("func"):
                names.add(value.func.name)
            names.update(f.name for f in value.list.func)
    return names & set(functions)


def _where(function: str, callers: dict, seen: frozenset = frozenset()) -> str:
    """'Dataset.map(parse_and_decode)' for the dataset function that (maybe indirectly) holds it."""
    match = _DATASET_FUNCTION.match(function)
    if match:
        rest = match.group(1)
        for method in sorted(_DATASET_METHODS, key=len, reverse=True):
            if rest.startswith(method + "_"):
                name = rest[len(method) + 1:]
                decode = ", the pipeline's decode" if name == "parse_and_decode" else ""
                return f"Dataset.{method}({name}){decode}"
        return f"Dataset function {rest}"
    for caller in sorted(callers.get(function, ())):
        if caller not in seen:
            return _where(caller, callers, seen | {function})
    return f"function {function}"


def source_python_calls(pipeline) -> list[tuple[str, str]]:
    """(call, where) for Python-calling TF functions in `pipeline.decode`'s source, no TensorFlow.

    Follows the functions and methods that `decode` calls by name in its own module and class,
    two levels deep. A call made through another module is only found by `graph_python_ops`.
    """
    cls = type(pipeline)
    found, seen = [], set()

    def scan(function, where, depth):
        if function in seen or not callable(function):
            return
        seen.add(function)
        try:
            source = inspect.getsource(function)
        except (OSError, TypeError):
            return
        for call in PYTHON_CALLS:
            if re.search(rf"\b{call}\s*\(", source):
                found.append((call, where))
        code = getattr(function, "__code__", None)
        if depth == 0 or code is None:
            return
        for name in code.co_names:
            target = getattr(cls, name, None) or function.__globals__.get(name)
            module = getattr(target, "__module__", None)
            if inspect.isfunction(target) and module == cls.__module__:
                scan(target, f"{where} -> {name}", depth - 1)

    scan(cls.decode, f"{cls.__module__}.{cls.__name__}.decode", 2)
    return sorted(set(found))


def python_op_finding(found: list[tuple[str, str]], config, target: Target,
                      seen_in: str = "the training input pipeline") -> Finding:
    """The verdict on Python functions in the training pipeline for the target.

    `seen_in` says what was looked at: the built pipeline's graph, or its decode's source.
    """
    if not found:
        return Finding(OK, FAMILY, f"{seen_in}: no Python functions (tf.py_function, "
                       "tf.numpy_function, Dataset.from_generator)")
    names = ", ".join(f"{PYTHON_OPS[op]} ({op}) in {where}" if op in PYTHON_OPS else
                      f"{op}(...) in {where}" for op, where in found)
    what = f"{seen_in} calls Python: {names}"
    fix = ("rewrite it with TensorFlow ops (tf.io, tf.image, tf.strings, ...) in the pipeline's "
           "decode, or convert the data so that decode needs none")
    if config.data.service_address:
        return Finding(ERROR, FAMILY, f"{what}; tf.data service workers "
                       f"(data.service_address={config.data.service_address}) cannot call back "
                       "into this Python process", fix)
    if target.remote_tpu:
        return Finding(ERROR, FAMILY, f"{what}; the TPU runtime.tpu={target.tpu} runs the input "
                       "pipeline on its own hosts, which have no Python process to call",
                       fix + ", or train on a Cloud TPU VM (runtime.tpu=local)")
    if target.kind == "tpu":
        return Finding(ADVICE, FAMILY, f"{what}; works on a TPU VM (this process runs the "
                       "pipeline) but under the GIL, one thread for the whole pipeline, often what "
                       "starves the TPU; a TPU node or tf.data service cannot run it", fix)
    return Finding(OK, FAMILY, f"{what}; runs in this process (under the GIL)")


# -- Static shapes ---------------------------------------------------------------------------

def static_shape_findings(element_spec) -> list[Finding]:
    """Errors for inputs that are ragged, sparse or not fully shaped; else one ok finding.

    `element_spec` is that of one replica's training dataset (batched).
    """
    import tensorflow as tf

    problems, shapes = [], []
    for path, spec in _flatten(element_spec):
        if isinstance(spec, (tf.RaggedTensorSpec, tf.SparseTensorSpec)):
            problems.append(Finding(ERROR, FAMILY, f"TPU needs dense, static shapes; the training "
                                    f"input {path} is {type(spec).__name__}",
                                    "pad it to a fixed length in the pipeline"))
        elif not spec.shape.is_fully_defined():
            batch_dim_unknown = spec.shape.rank and spec.shape[0] is None
            fix = ("batch with drop_remainder=True" if batch_dim_unknown else
                   "resize or pad it to a fixed shape in the pipeline's decode")
            problems.append(Finding(ERROR, FAMILY, f"TPU needs static shapes; the training input "
                                    f"{path} has shape {spec.shape}", fix))
        else:
            shapes.append(f"{tuple(spec.shape)} {spec.dtype.name}")
    return problems or [Finding(OK, FAMILY, "training batches of one replica have static shapes: "
                                + ", ".join(shapes))]


def _flatten(spec, path: str = "element"):
    """(path, TypeSpec) pairs of a nested (features, label) element spec."""
    if isinstance(spec, dict):
        return [pair for key in sorted(spec) for pair in _flatten(spec[key], f"{path}[{key!r}]")]
    if isinstance(spec, (tuple, list)):
        return [pair for i, item in enumerate(spec) for pair in _flatten(item, f"{path}[{i}]")]
    return [(path, spec)]


# -- The checks ------------------------------------------------------------------------------

def training_dataset_fn(config, per_replica_batch: int):
    """Builds one replica's training dataset exactly as `train` does (its `dataset_fn`)."""
    from tftrain.data import foreign, reader

    def build():
        return reader.load(
            config.data.dir, config.data.train_split,
            per_replica_batch * config.train.grad_accum_steps, training=True,
            shuffle_buffer=config.data.shuffle_buffer, cache=config.data.cache, repeat=True,
            seed=config.train.seed, service_address=config.data.service_address,
            service_mode=config.data.service_mode, **foreign.load_kwargs(config.data))

    return build


def check(config, target: Target) -> list[Finding]:
    """Python functions in the training pipeline, and (TPU) static shapes of its batches.

    Reads the dataset's manifest; needs TensorFlow, runs no op.
    """
    per_replica = max(config.data.batch_size // target.replicas, 1)
    build = training_dataset_fn(config, per_replica)
    specs = []

    def build_and_keep_spec():
        dataset = build()
        specs.append(dataset.element_spec)
        return dataset

    findings = [python_op_finding(graph_python_ops(build_and_keep_spec), config, target)]
    if target.kind == "tpu":
        findings += static_shape_findings(specs[0])
    return findings


def check_source(config, target: Target) -> list[Finding]:
    """`python_op_finding` from the pipeline's decode source (no TensorFlow, no data)."""
    from pipelines import load_pipeline

    pipeline = load_pipeline(config.data.pipeline, **config.data.pipeline_options)
    seen_in = (f"the decode of data.pipeline={config.data.pipeline}, read from its source (the "
               "built pipeline needs the data)")
    return [python_op_finding(source_python_calls(pipeline), config, target, seen_in)]

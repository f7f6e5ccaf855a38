"""XLA: the real train and eval steps, compiled and run once on the CPU on one real batch.

The trainer is compiled with `jit_compile=True` whenever the run would use XLA on the target
(`uses_xla`): always on a TPU (TPUStrategy compiles every step), on a GPU unless
`runtime.jit_compile=false` (`auto` means XLA there, see `tftrain.engine.backends.use_xla`), and on
a CPU or multi-worker target only with `runtime.jit_compile=true`. XLA then compiles the same
step (model, loss, optimizer, metrics) it would compile there, here for the CPU; an op XLA
cannot compile fails here as it would there. The failing op is parsed from TensorFlow's error
("Detected unsupported operations ... EagerPyFunc ... {{node model/layer/EagerPyFunc}}") and
mapped to its layer by the name scope of its node. Otherwise the step runs as `train` runs it
(no XLA, and the line says why), which still catches shape, dtype and loss errors.

The CPU's XLA is not the TPU's: an op compiled here can still lack a TPU kernel (float64, some
string, sparse and dynamic-shape ops), and only the TPU's compiler can say so.
"""
from __future__ import annotations

import math
import os
import re
import sys

from tftrain.rules.report import ERROR, OK, Finding, Target

FAMILY = "xla"
_UNSUPPORTED = re.compile(r"(\w+) \(No registered '\w+' OpKernel for (XLA_\w+) devices "
                          r"compatible with node \{\{node ([^}]+)\}\}")
_NODE = re.compile(r"\{\{node ([^}]+)\}\}")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_HINTS = {
    "EagerPyFunc": "a Python function (tf.py_function) cannot be compiled: rewrite it with "
                   "TensorFlow ops, or move it into the input pipeline",
    "PyFunc": "a Python function (tf.numpy_function) cannot be compiled: rewrite it with "
              "TensorFlow ops, or move it into the input pipeline",
}
_STRING_HINT = ("strings cannot live on a TPU: do the string work in the input pipeline and "
                "feed the model numbers")


def uses_xla(config, target: Target) -> tuple[bool, str]:
    """Whether `train` would compile the steps with XLA on `target`, and the words that say so.

    TPU: always. GPU: `runtime.jit_compile` auto or true (false: skipped, and said). CPU and
    multi-worker: only with `runtime.jit_compile=true` (auto is XLA on GPUs only).
    """
    setting = f"runtime.jit_compile={config.runtime.jit_compile}"
    if target.kind == "tpu":
        return True, "compiled by XLA for the CPU (jit_compile=True, as TPUStrategy compiles it)"
    if config.runtime.jit_compile == "true" or (target.kind == "gpu"
                                                 and config.runtime.jit_compile == "auto"):
        on = " on a GPU" if target.kind == "gpu" else ""
        return True, (f"compiled by XLA for the CPU (jit_compile=True, as `train` compiles it"
                      f"{on} with {setting})")
    if target.kind == "gpu":
        return False, f"run as `train` runs it on a GPU, XLA compile skipped ({setting})"
    why = ": XLA on GPUs and TPUs only" if config.runtime.jit_compile == "auto" else ""
    return False, f"run as `train` runs it, without XLA ({setting}{why})"


def check(trainer, model, train_batch, eval_batch, how: str, policy: str) -> list[Finding]:
    """Runs one train step and one eval step; one finding each.

    `train_batch` and `eval_batch` are (inputs, labels) of one replica; `eval_batch` may be None
    (the split has no full batch, which the batch check reports). `how` is `uses_xla`'s words.
    """
    how = f"{how} in {policy}"
    findings = [_step("train step (model, loss, optimizer)", how, model, train_batch,
                      lambda: trainer.train_on_batch(*train_batch, return_dict=True))]
    if eval_batch is None:
        findings.append(Finding(OK, FAMILY, "eval step not run: the evaluation split has no "
                                "full batch (see the batch check)"))
    else:
        findings.append(_step("eval step (model, loss, metrics)", how, model, eval_batch,
                              lambda: trainer.test_on_batch(*eval_batch, return_dict=True)))
    return findings


def _step(name: str, how: str, model, batch, run) -> Finding:
    import tensorflow as tf

    size = int(tf.nest.flatten(batch[0])[0].shape[0])
    try:
        logs = run()
    except (tf.errors.OpError, ValueError, TypeError) as e:
        return explain_failure(name, e, model)
    loss = logs.get("loss")
    if loss is not None and not math.isfinite(float(loss)):
        return Finding(ERROR, FAMILY, f"{name} {how} ran on one batch of {size}, but its loss "
                       f"is {float(loss)}", "check the inputs' scale, the labels and the learning "
                       "rate")
    return Finding(OK, FAMILY, f"{name} {how}, ran on one batch of {size}"
                   + ("; finite loss" if loss is not None else ""))


def explain_failure(name: str, error: BaseException, model) -> Finding:
    """One error finding naming the op, its layer, the user's line and the fix."""
    text = str(error)
    unsupported = _UNSUPPORTED.findall(text)
    frame = _user_frame(text)
    if unsupported:
        ops = []
        for op, device, node in dict.fromkeys(unsupported):
            ops.append(f"op {op} ({_layer_of(node, model)}, node {node}) has no {device} kernel")
        op = unsupported[0][0]
        hint = _HINTS.get(op) or (_STRING_HINT if "String" in op or op in ("AsString",) else
                                  "replace the op with ones XLA compiles, or compute it in the "
                                  "input pipeline")
        return Finding(ERROR, FAMILY, f"{name} does not compile with XLA: {'; '.join(ops)}{frame}",
                       hint)
    node = _NODE.search(text)
    where = f" at {_layer_of(node.group(1), model)} (node {node.group(1)})" if node else ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = next((line for line in lines if not line.startswith("Graph execution error")),
                 type(error).__name__)
    return Finding(ERROR, FAMILY, f"{name} failed{where}: {first[:300]}{frame}",
                   "fix the model or its input so that one step runs")


def _layer_of(node: str, model) -> str:
    """'layer 'odd' (Lambda)' for node 'model/odd/EagerPyFunc', from the name scopes."""
    layers = {layer.name: layer for layer in model._flatten_layers(include_self=False)}
    for part in reversed(node.split("/")[:-1]):
        if part in layers:
            return f"layer {part!r} ({type(layers[part]).__name__})"
    return f"outside the model's layers ({node.split('/')[0]})"


def _user_frame(text: str) -> str:
    """', created at FILE:LINE in FUNC' for the last frame outside site-packages, if any."""
    section = text.split("The op is created at:", 1)
    frames = [m for m in _FRAME.finditer(section[1] if len(section) > 1 else "")
              if "site-packages" not in m.group(1)]
    if not frames:
        return ""
    path, line, function = frames[-1].groups()
    return f", created at {_shown(path)}:{line} in {function}"


def _shown(path: str) -> str:
    """The file of a frame, relative to the current directory when it is under it.

    TensorFlow prints the frames' paths less their common prefix (`/`, or more), so a relative
    one is first matched to the file of a loaded module that ends with it.
    """
    if not os.path.isabs(path):
        files = (getattr(module, "__file__", None) for module in list(sys.modules.values()))
        path = next((f for f in files if isinstance(f, str) and os.path.isabs(f)
                     and f.endswith(os.sep + path)), path)
    relative = os.path.relpath(path) if os.path.isabs(path) else path
    return path if relative.startswith(os.pardir) else relative

"""Storage: can the machines of the target read `data.dir` and write `--model_dir`?

Config only (no TensorFlow, no file access). `gs://` works from every TPU host and worker.
A local path works on a Cloud TPU VM (`runtime.tpu=local`: the VM runs the input pipeline and
writes the run) if it will exist there: the embedded digits data, or a `data.source` to convert
from, is converted there on first use; other datasets must be copied. A TPU node or pod reached
by name or `grpc://` reads its input and writes checkpoints on its own hosts, which cannot see
this machine's disk: a local path is an error there. Multi-worker runs need a path every worker
sees (a shared filesystem or `gs://`).
"""
from __future__ import annotations

from tftrain.rules.report import ADVICE, ERROR, OK, Finding, Target

FAMILY = "storage"


def scheme(path: str) -> str:
    """'gs' for gs://..., '' for a local path."""
    return path.split("://", 1)[0] if "://" in path else ""


def check(config, target: Target, model_dir: str | None,
          convert_data: bool = True) -> list[Finding]:
    """One finding for `data.dir` and one for the run directory.

    `convert_data` is `train`'s: False when it would not convert a missing dataset.
    """
    return [_data_dir(config, target, convert_data), _model_dir(model_dir, target)]


def converts_on_first_use(data, convert_data: bool = True) -> str:
    """How `train` would create a missing `data.dir` by itself, or '' when it would not."""
    if data.format == "tfrecord" or not convert_data:
        return ""
    if data.source:
        return f"converted on first use from data.source={data.source}"
    if data.pipeline in EMBEDDED_DATA:
        return f"converted on first use, from {EMBEDDED_DATA[data.pipeline]}"
    return ""


# Pipelines that convert data of their own when data.source is empty (no network).
EMBEDDED_DATA = {"digits": "the digits data that ships with scikit-learn",
                 "diabetes": "the diabetes data that ships with scikit-learn",
                 "text": "Python's own documentation (pydoc_data.topics)",
                 "jsonl": "the names of Unicode characters (Python's unicodedata)"}


def _not_local(key: str, path: str, able: str) -> Finding | None:
    """The finding for a gs:// (or other scheme's) path; None for a local one."""
    kind = scheme(path)
    if kind == "gs":
        return Finding(OK, FAMILY, f"{key}: Cloud Storage, {able} from every host and worker")
    if kind:
        return Finding(ADVICE, FAMILY, f"{key}: {kind}:// is not checked here; every host that "
                       "uses it needs TensorFlow's filesystem for it")
    return None


def _data_dir(config, target: Target, convert_data: bool) -> Finding:
    key = f"data.dir={config.data.dir}"
    remote = _not_local(key, config.data.dir, "readable")
    if remote:
        return remote
    return _pick(
        target,
        node=Finding(ERROR, FAMILY, f"{key} is on this machine's disk, but the TPU "
                     f"runtime.tpu={target.tpu} runs the input pipeline on its own hosts, which "
                     "cannot read it", "copy the dataset to gs://YOUR_BUCKET/... (same region as "
                     "the TPU) and set data.dir to it"),
        vm=_on_a_tpu_vm(key, config.data, convert_data),
        workers=Finding(ADVICE, FAMILY, f"{key} is a local path: every worker reads it at that "
                        "path", "use a shared filesystem or gs://"),
        here=Finding(OK, FAMILY, f"{key}: a local path on this {target.kind} machine"))


def _on_a_tpu_vm(key: str, data, convert_data: bool) -> Finding:
    how = converts_on_first_use(data, convert_data)
    if how and data.source and not scheme(data.source):
        return Finding(ADVICE, FAMILY, f"{key} is on the TPU VM's own disk: {how}, a local path "
                       "that must exist on the VM too",
                       "copy the source to the VM, or use gs:// for data.source or data.dir")
    if how:
        return Finding(OK, FAMILY, f"{key} is on the TPU VM's own disk: {how}")
    return Finding(ADVICE, FAMILY, f"{key} is on the TPU VM's own disk: it exists there only if "
                   "you copy it (a TPU VM cannot read this machine's disk)",
                   "copy the dataset to the VM, or use gs://YOUR_BUCKET/...")


def _model_dir(model_dir: str | None, target: Target) -> Finding:
    key = f"--model_dir={model_dir}" if model_dir else "the run directory (runs/...)"
    remote = _not_local(key, model_dir or "", "writable")
    if remote:
        return remote
    gcs = "pass --model_dir=gs://YOUR_BUCKET/runs/NAME"
    return _pick(
        target,
        node=Finding(ERROR, FAMILY, f"{key} is local, but the TPU runtime.tpu={target.tpu} writes "
                     "checkpoints and the export on its own hosts, which cannot write this "
                     "machine's disk", gcs),
        vm=Finding(ADVICE, FAMILY, f"{key} is on the TPU VM's disk: it is deleted with the VM (a "
                   "preempted spot VM loses its backup, so the run cannot resume)", gcs),
        workers=Finding(ADVICE, FAMILY, f"{key} is local: every worker takes part in saving",
                        "use the same shared directory or gs:// path on every worker"),
        here=Finding(OK, FAMILY, f"{key}: local, on this {target.kind} machine"))


def _pick(target: Target, *, node: Finding, vm: Finding, workers: Finding,
          here: Finding) -> Finding:
    """The finding for a local path: on a TPU node or pod, a TPU VM, multi-worker, one machine."""
    if target.remote_tpu:
        return node
    if target.kind == "tpu":
        return vm
    return workers if target.kind == "multi_worker" else here

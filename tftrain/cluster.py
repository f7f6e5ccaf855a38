"""Who this process is in a multi-worker cluster, and where it may write.

The cluster is described by the `TF_CONFIG` environment variable (set by `tftrain launch`, by
`tftrain train --worker_hosts=... --task_index=i`, or by a cluster manager):

    {"cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}, "task": {"type": "worker", "index": 0}}

Worker 0 (or the task of type `chief`, when there is one) is the chief: only it writes the
files of a run (params.yaml, summary.json, TensorBoard logs, the export). Every worker still
takes part in every save, since saving a distributed model runs collective ops; the other
workers save into a temporary directory of their own (`write_dir_for`), removed afterwards
(`cleanup`). Nothing here imports TensorFlow at module level, so the CLI can set TF_CONFIG
before TensorFlow starts.
"""
from __future__ import annotations

import json
import os
import tempfile
import time

from tftrain.errors import ConfigError, TftrainError

TF_CONFIG = "TF_CONFIG"
# Debug aid for tests and bug reports: when set, every worker writes its final weights here.
WEIGHTS_DUMP_ENV = "TFTRAIN_DUMP_WEIGHTS_DIR"
# How long non-chief workers wait for the chief to convert the dataset on first use.
DATASET_WAIT_SECONDS = 1800


def tf_config() -> dict:
    """The parsed TF_CONFIG, or {} when it is not set; a malformed one is a ConfigError."""
    text = os.environ.get(TF_CONFIG, "").strip()
    if not text:
        return {}
    try:
        parsed = json.loads(text)
        task_type, index = parsed["task"]["type"], int(parsed["task"]["index"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"TF_CONFIG is not valid ({e!r}): {text}; expected "
                          '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", '
                          '"index": i}}') from None
    tasks = parsed["cluster"].get(task_type, [])
    if not 0 <= index < len(tasks):
        raise ConfigError(f"TF_CONFIG task index {index} is outside the {len(tasks)} {task_type!r} "
                          f"task(s) of the cluster: {text}")
    return parsed


def num_workers() -> int:
    """How many training workers (chief included) TF_CONFIG lists; 1 without TF_CONFIG."""
    cluster = tf_config().get("cluster", {})
    return max(1, len(cluster.get("worker", [])) + len(cluster.get("chief", [])))


def task() -> tuple[str, int]:
    """This process's (task type, index); ("worker", 0) without TF_CONFIG."""
    parsed = tf_config()
    if not parsed:
        return "worker", 0
    return parsed["task"]["type"], int(parsed["task"]["index"])


def is_chief(strategy=None) -> bool:
    """True for the process that writes the run's files.

    With a strategy, asks it (`extended.should_checkpoint`: True for every single-process
    strategy, the chief's flag under MultiWorkerMirrored); otherwise reads TF_CONFIG.
    """
    if strategy is not None:
        return bool(strategy.extended.should_checkpoint)
    parsed = tf_config()
    if not parsed:
        return True
    task_type, index = task()
    if task_type == "chief":
        return True
    return task_type == "worker" and index == 0 and not parsed["cluster"].get("chief")


def make_tf_config(worker_hosts: list[str], task_index: int) -> str:
    """The TF_CONFIG JSON for worker `task_index` of `worker_hosts` ("host:port" each)."""
    hosts = [h.strip() for h in worker_hosts if h.strip()]
    if not hosts:
        raise ConfigError("--worker_hosts is empty: give host:port,host:port (one per worker)")
    for host in hosts:
        name, sep, port = host.rpartition(":")
        if not sep or not name or not port.isdigit():
            raise ConfigError(f"--worker_hosts entry {host!r} is not host:port")
    if len(set(hosts)) != len(hosts):
        raise ConfigError(f"--worker_hosts lists an address twice: {','.join(hosts)}")
    if not 0 <= task_index < len(hosts):
        raise ConfigError(f"--task_index={task_index} is outside the {len(hosts)} worker(s) of "
                          f"--worker_hosts (0..{len(hosts) - 1})")
    return json.dumps({"cluster": {"worker": hosts}, "task": {"type": "worker", "index": task_index}})


def set_tf_config(worker_hosts: list[str], task_index: int) -> None:
    """Sets TF_CONFIG for this process from `--worker_hosts`/`--task_index` (before TF starts)."""
    if os.environ.get(TF_CONFIG):
        raise ConfigError("both TF_CONFIG and --worker_hosts are set: use one of them")
    os.environ[TF_CONFIG] = make_tf_config(worker_hosts, task_index)


def write_dir_for(path: str, strategy=None) -> str:
    """Where this worker writes a save meant for `path`: `path` itself on the chief, a fresh
    local temporary directory on every other worker (remove it with `cleanup`)."""
    if is_chief(strategy):
        return path
    task_type, index = task()
    base = os.path.basename(path.rstrip("/")) or "save"
    return os.path.join(tempfile.mkdtemp(prefix=f"tftrain-{task_type}{index}-"), base)


def cleanup(written: str, path: str) -> None:
    """Removes a non-chief worker's temporary save (`written`, from `write_dir_for(path)`)."""
    if written == path:
        return
    import shutil

    shutil.rmtree(os.path.dirname(written), ignore_errors=True)


def wait_for(path: str, what: str, timeout: float, poll: float = 0.5) -> None:
    """Waits until `path` exists (written by the chief); raises TftrainError after `timeout` s."""
    import tensorflow as tf

    deadline = time.monotonic() + timeout
    while not tf.io.gfile.exists(path):
        if time.monotonic() > deadline:
            raise TftrainError(f"waited {timeout:.0f}s for the chief to write {what} ({path}); "
                               "did the chief fail? Check its log")
        time.sleep(poll)


def dump_weights(model) -> None:
    """When TFTRAIN_DUMP_WEIGHTS_DIR is set, writes this worker's weights there (an .npz named
    after the task), so the workers' final weights can be compared."""
    directory = os.environ.get(WEIGHTS_DUMP_ENV)
    if not directory:
        return
    import numpy as np

    task_type, index = task()
    os.makedirs(directory, exist_ok=True)
    np.savez(os.path.join(directory, f"{task_type}-{index}.npz"), *model.get_weights())

"""Who this process is in a multi-worker cluster, and where it may write.

`runtime.cluster` says where the description of the cluster comes from:

- `tf_config`: the `TF_CONFIG` environment variable (set by `tftrain launch`, by
  `tftrain train --worker_hosts=... --task_index=i`, by a Kubeflow TFJob or by hand):

      {"cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}, "task": {"type": "worker", "index": 0}}

  One machine when it is unset.
- `slurm`: the variables `srun` sets in each task (SLURM_PROCID, SLURM_STEP_NUM_TASKS,
  SLURM_STEP_TASKS_PER_NODE, SLURM_STEP_NODELIST); TensorFlow's SlurmClusterResolver turns
  them into addresses. Worker i is SLURM task i.
- `kubernetes`: TensorFlow's KubernetesClusterResolver asks the API server for the worker pods;
  the pod's index and the worker count come from JOB_COMPLETION_INDEX (set in an Indexed Job)
  and TFTRAIN_NUM_WORKERS.
- `auto` (the default): TF_CONFIG when it is set, else SLURM inside an `srun` step of more
  than one task, else one machine.

`membership` reads the chosen source without TensorFlow (TF_CONFIG must be set, and the
config checked, before TensorFlow starts); `tftrain.runtime.distribute` builds the TensorFlow
resolver from the same source and checks that both agree. `use` records the choice (`tftrain train`
calls it once the config is loaded, the strategy factory again), so that `num_workers`, `task`
and `is_chief` describe the same cluster as the strategy.

Worker 0 (or the task of type `chief`, when there is one) is the chief: only it writes the
files of a run (params.yaml, summary.json, TensorBoard logs, the export). Every worker still
takes part in every save, since saving a distributed model runs collective ops; the other
workers save into a temporary directory of their own (`write_dir_for`), removed afterwards
(`cleanup`). Nothing here imports TensorFlow at module level.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import tempfile
import time

from absl import logging

from tftrain.errors import ConfigError, TftrainError

TF_CONFIG = "TF_CONFIG"
# What TensorFlow's SlurmClusterResolver reads: this task's rank and the step's tasks and nodes.
SLURM_VARS = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE",
              "SLURM_STEP_NODELIST")
# runtime.cluster=kubernetes: this pod's index (Kubernetes sets it in an Indexed Job), the number
# of worker pods, and the label selector of the worker pods (TensorFlow's default selector).
K8S_INDEX, K8S_NUM_WORKERS, K8S_SELECTOR = ("JOB_COMPLETION_INDEX", "TFTRAIN_NUM_WORKERS",
                                            "TFTRAIN_K8S_SELECTOR")
K8S_DEFAULT_SELECTOR = "job-name=tensorflow"
# Debug aid for tests and bug reports: when set, every worker writes its final weights here.
WEIGHTS_DUMP_ENV = "TFTRAIN_DUMP_WEIGHTS_DIR"
# How long non-chief workers wait for the chief to convert the dataset on first use.
DATASET_WAIT_SECONDS = 1800

_chosen = {"cluster": "auto"}  # runtime.cluster of this process (see `use`)


@dataclasses.dataclass(frozen=True)
class Membership:
    """This process's place in its cluster, as the chosen source describes it.

    `source` is "tf_config", "slurm" or "kubernetes", or "" on one machine.
    """

    source: str = ""
    num_workers: int = 1  # training workers, the chief included
    task_type: str = "worker"
    task_index: int = 0
    chief: bool = True


def use(cluster: str) -> Membership:
    """Makes `cluster` (runtime.cluster) the source that every later call here reads, and
    checks it against the environment now (a ConfigError names what is missing)."""
    from tftrain.config_schema import CLUSTERS  # no TensorFlow

    if cluster not in CLUSTERS:
        raise ConfigError(f"runtime.cluster={cluster!r} is not one of {', '.join(CLUSTERS)}")
    _chosen["cluster"] = cluster
    return membership()


def membership() -> Membership:
    """Where this process stands in its cluster, read from the chosen source (no TensorFlow)."""
    chosen = _chosen["cluster"]
    if chosen == "auto":
        if os.environ.get(TF_CONFIG, "").strip():
            chosen = "tf_config"
        elif os.environ.get("SLURM_PROCID") and os.environ.get("SLURM_STEP_NUM_TASKS", "1") != "1":
            chosen = "slurm"  # inside `srun` with more than one task
        else:
            _warn_on_a_batch_step()
            return Membership()
    return {"tf_config": _from_tf_config, "slurm": _from_slurm,
            "kubernetes": _from_kubernetes}[chosen]()


def _warn_on_a_batch_step() -> None:
    job, tasks = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_NTASKS", "1")
    if job and tasks != "1" and not os.environ.get("SLURM_STEP_NUM_TASKS"):
        logging.log_first_n(
            logging.WARNING, "SLURM job %s has SLURM_NTASKS=%s, but this process is not in an "
            "srun step: training on this machine alone. Start one `tftrain train` per task with "
            "`srun` for multi-worker training (docs/scale.md)", 1, job, tasks)


def _from_tf_config() -> Membership:
    parsed = tf_config()
    if not parsed:
        return Membership()
    cluster = parsed["cluster"]
    task_type, index = parsed["task"]["type"], int(parsed["task"]["index"])
    chief = task_type == "chief" or (task_type == "worker" and index == 0
                                     and not cluster.get("chief"))
    workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
    return Membership("tf_config", max(1, workers), task_type, index, chief)


def _from_slurm() -> Membership:
    _refuse_tf_config("slurm")
    missing = [name for name in SLURM_VARS if not os.environ.get(name)]
    if missing:
        raise ConfigError(
            f"runtime.cluster=slurm needs {', '.join(missing)} in the environment, which `srun` "
            "sets in each task; fix: start one `tftrain train` per task with srun inside the job "
            "(docs/scale.md has an sbatch script), or set runtime.cluster=auto to train on one "
            "machine outside srun")
    return _indexed("slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS")


def _from_kubernetes() -> Membership:
    _refuse_tf_config("kubernetes")
    if importlib.util.find_spec("kubernetes") is None:
        raise ConfigError(
            "runtime.cluster=kubernetes needs the kubernetes Python client (TensorFlow's "
            "KubernetesClusterResolver asks the API server for the worker pods), which is not "
            "installed; fix: pip install kubernetes, or run the workers as a Kubeflow TFJob, which "
            "sets TF_CONFIG (runtime.cluster=auto or tf_config; docs/scale.md)")
    missing = [name for name in (K8S_INDEX, K8S_NUM_WORKERS) if not os.environ.get(name)]
    if missing:
        raise ConfigError(
            f"runtime.cluster=kubernetes needs {', '.join(missing)} in the pod's environment: "
            f"{K8S_INDEX} is this pod's index (an Indexed Job sets it), {K8S_NUM_WORKERS} the "
            f"number of worker pods; fix: run the workers as an Indexed Job and set "
            f"{K8S_NUM_WORKERS} (and {K8S_SELECTOR}, the pods' label selector) in its pod template")
    return _indexed("kubernetes", K8S_INDEX, K8S_NUM_WORKERS)


def _refuse_tf_config(source: str) -> None:
    if os.environ.get(TF_CONFIG, "").strip():
        raise ConfigError(f"runtime.cluster={source} but TF_CONFIG is set too (by --worker_hosts, "
                          "tftrain launch or the environment); fix: unset TF_CONFIG, or set "
                          "runtime.cluster=tf_config to use it")


def _indexed(source: str, index_var: str, count_var: str) -> Membership:
    """Worker `$index_var` of `$count_var` (environment variables holding integers)."""
    values = {}
    for name in (index_var, count_var):
        try:
            values[name] = int(os.environ[name])
        except ValueError:
            raise ConfigError(f"runtime.cluster={source}: {name}={os.environ[name]!r} is not an "
                              "integer") from None
    index, count = values[index_var], values[count_var]
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"runtime.cluster={source}: {index_var}={index} is not a task of "
                          f"{count_var}={count} (0..{count - 1})")
    return Membership(source, count, "worker", index, index == 0)


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
    """How many training workers (chief included) the cluster has; 1 on one machine."""
    return membership().num_workers


def task() -> tuple[str, int]:
    """This process's (task type, index); ("worker", 0) on one machine."""
    member = membership()
    return member.task_type, member.task_index


def is_chief(strategy=None) -> bool:
    """True for the process that writes the run's files.

    With a strategy, asks it (`extended.should_checkpoint`: True for every single-process
    strategy, the chief's flag under MultiWorkerMirrored); otherwise reads the cluster's source.
    """
    if strategy is not None:
        return bool(strategy.extended.should_checkpoint)
    return membership().chief


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


def dump_weights(model, extra=()) -> None:
    """When TFTRAIN_DUMP_WEIGHTS_DIR is set, writes this worker's weights there (an .npz named
    after the task), then the variables `extra`, so the workers' final weights can be compared."""
    directory = os.environ.get(WEIGHTS_DUMP_ENV)
    if not directory:
        return
    import numpy as np

    task_type, index = task()
    os.makedirs(directory, exist_ok=True)
    np.savez(os.path.join(directory, f"{task_type}-{index}.npz"), *model.get_weights(),
             *(v.numpy() for v in extra))

"""The strategy factory: one place that turns `runtime.*` into a `tf.distribute.Strategy`.

Call `create_strategy` before any other TensorFlow op: virtual CPU devices, collective ops
(MultiWorkerMirrored) and the TPU system must be configured before the runtime starts.
"""
from __future__ import annotations

import os

import tensorflow as tf
from absl import logging

from tftrain.runtime import cluster
from tftrain.config_schema import RuntimeConfig
from tftrain.errors import ConfigError, TftrainError, first_line
from tftrain.timeout import run_bounded


def configure_cpu_devices(count: int) -> None:
    """Splits the first CPU into `count` logical devices (before the runtime initializes)."""
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
    except RuntimeError:
        existing = len(tf.config.list_logical_devices("CPU"))
        if existing < count:
            raise TftrainError(
                f"runtime.cpu_devices={count} but TensorFlow already started with {existing} CPU "
                "device(s); virtual devices must be configured before any TensorFlow op runs "
                "(start a new process)") from None


def create_strategy(runtime: RuntimeConfig) -> tf.distribute.Strategy:
    """Builds the strategy that `runtime.strategy` names."""
    if runtime.cpu_devices > 0:
        configure_cpu_devices(runtime.cpu_devices)
    cluster.use(runtime.cluster)  # num_workers()/is_chief() now describe this strategy's cluster
    name = runtime.strategy
    if name in ("dtensor", "pipeline"):  # these runs export an ordinary model: prune it as `auto`
        logging.info("runtime.strategy=%s is not a tf.distribute strategy: using auto here", name)
        name = "auto"
    if name == "auto":
        if runtime.tpu:
            name = "tpu"
        elif cluster.num_workers() > 1:
            name = "multi_worker_mirrored"
        elif tf.config.list_physical_devices("GPU"):
            name = "mirrored"
        else:
            name = "one_device"
    strategy = {
        "one_device": _one_device,
        "mirrored": _mirrored,
        "multi_worker_mirrored": multi_worker_mirrored,
        "tpu": _tpu,
    }[name](runtime)
    logging.info("strategy %s (%s) with %d replica(s)", strategy_name(strategy),
                 type(strategy).__name__, strategy.num_replicas_in_sync)
    return strategy


def strategy_name(strategy: tf.distribute.Strategy) -> str:
    """The config name of a strategy instance (for summaries)."""
    return {
        "OneDeviceStrategy": "one_device",
        "_DefaultDistributionStrategy": "one_device",  # on a CPU-only host (see _one_device)
        "MirroredStrategy": "mirrored",
        "CollectiveAllReduceStrategy": "multi_worker_mirrored",
        "MultiWorkerMirroredStrategy": "multi_worker_mirrored",
        "TPUStrategy": "tpu",
        "TPUStrategyV2": "tpu",
    }.get(type(strategy).__name__, type(strategy).__name__)


def _one_device(runtime):
    """OneDeviceStrategy on the first GPU; on a host without one, TensorFlow's default strategy.

    On a CPU, OneDeviceStrategy gains nothing (there is no device to prefetch to) and costs a
    great deal: once its distributed input iterator exists, every op of the training step runs
    slower (measured on a 2-core host, TF 2.21: a transformer_lm's steps at 0.73x, with 30%
    more CPU time, whether or not the iterator fetches to the device or buffers). The default
    strategy places everything on the one CPU just the same, and Keras reads the dataset
    directly.
    """
    if tf.config.list_physical_devices("GPU"):
        return tf.distribute.OneDeviceStrategy("/gpu:0")
    return tf.distribute.get_strategy()


def _mirrored(runtime):
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return tf.distribute.MirroredStrategy([d.name for d in gpus])
    cpus = tf.config.list_logical_devices("CPU")
    if runtime.cpu_devices > 1:
        # Reduce through one device rather than with collectives: collective instance keys restart
        # with every strategy object, so a second Mirrored strategy in the same process (tests,
        # notebooks) would clash with the first one's cached collective parameters.
        return tf.distribute.MirroredStrategy([d.name for d in cpus[: runtime.cpu_devices]],
                                              cross_device_ops=tf.distribute.ReductionToOneDevice())
    logging.warning("strategy mirrored: no GPU and runtime.cpu_devices <= 1, so one CPU replica; "
                    "set runtime.cpu_devices=N to mirror over N virtual CPU devices")
    return tf.distribute.MirroredStrategy([cpus[0].name])


def multi_worker_mirrored(runtime):
    """MultiWorkerMirroredStrategy over the cluster this process is in (its collective
    runtime started: the pipeline backend uses only that)."""
    member = cluster.membership()  # the environment was checked before TensorFlow started
    if not member.source:
        raise ConfigError(
            "strategy multi_worker_mirrored needs the TF_CONFIG environment variable "
            '(e.g. {"cluster": {"worker": ["host1:port", "host2:port"]}, "task": {"type": "worker", '
            '"index": 0}}), --worker_hosts=host:port,host:port --task_index=i, or one `tftrain '
            "train` per SLURM task under srun (runtime.cluster=auto or slurm); `tftrain launch "
            "--num_workers=N -- train ...` sets TF_CONFIG for local runs")
    resolver = cluster_resolver(member, runtime.cluster_port)
    if len(os.sched_getaffinity(0)) < 2 and not tf.config.threading.get_inter_op_parallelism_threads():
        # On one core TensorFlow would size its inter-op pool to 1 thread: the collectives' network
        # callbacks then wait behind every compute op (measured: 2.5x slower steps).
        tf.config.threading.set_inter_op_parallelism_threads(2)
    # One all-reduce for all gradients (packed up to 32 MiB) rather than one per variable: on CPU
    # workers over TCP the per-collective latency, not the bytes, dominates a small model's step.
    options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=32 << 20,
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    logging.info("multi-worker (%s): %s %d of %d workers %s", member.source, member.task_type,
                 member.task_index, member.num_workers, resolver.cluster_spec().as_dict())
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver,
                                                     communication_options=options)


def cluster_resolver(member: cluster.Membership, port: int = 0, kubernetes_client=None):
    """TensorFlow's cluster resolver for `member.source` (see tftrain/runtime/cluster.py),
    checked to agree with `member` (the worker count and this task, as tftrain read them before TensorFlow started).

    Args:
      member: `cluster.membership()` of a multi-worker source.
      port: runtime.cluster_port: the first port of the workers' servers for slurm and kubernetes;
        0 keeps TensorFlow's default (8888 and 8470).
      kubernetes_client: for kubernetes, a CoreV1Api-like client (TensorFlow's `override_client`);
        default: the in-cluster client of the `kubernetes` package.
    """
    if member.source == "tf_config":
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    elif member.source == "slurm":
        resolver = _slurm_resolver(member, port)
    elif member.source == "kubernetes":
        resolver = _kubernetes_resolver(member, port, kubernetes_client)
    else:
        raise ValueError(f"no cluster resolver for source {member.source!r}")
    try:
        spec = resolver.cluster_spec().as_dict()
    except RuntimeError as e:  # e.g. Kubernetes: 'Pod "x" is not running; phase: "Pending"'
        raise TftrainError(f"runtime.cluster={member.source}: TensorFlow's "
                           f"{type(resolver).__name__} cannot list the workers: {e}") from None
    found = len(spec.get("worker", [])) + len(spec.get("chief", []))
    seen = (resolver.task_type, resolver.task_id)
    if (found, seen) != (member.num_workers, (member.task_type, member.task_index)):
        raise TftrainError(
            f"runtime.cluster={member.source}: TensorFlow's {type(resolver).__name__} sees "
            f"{found} worker(s) {spec} and this process as {seen[0]} {seen[1]}, but the "
            f"environment says {member.num_workers} worker(s) and {member.task_type} "
            f"{member.task_index}")
    return resolver


def _slurm_resolver(member: cluster.Membership, port: int):
    """SlurmClusterResolver: worker i is SLURM task i; the tasks of a node listen on port,
    port+1, ... of that node (the node names come from SLURM_STEP_NODELIST)."""
    ports = {"port_base": port} if port else {}
    slurm_env = ", ".join(f"{name}={os.environ.get(name)!r}" for name in cluster.SLURM_VARS)
    try:
        if _visible_gpus():
            # TensorFlow splits the node's GPUs among its tasks (it sets CUDA_VISIBLE_DEVICES).
            resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(**ports)
            spec = resolver.cluster_spec()
        else:
            # No GPUs: TensorFlow cannot be told so (gpus_per_node=0 fails in cluster_spec(), TF
            # issue #56894). Give each task a nominal GPU slot that is never used (auto_set_gpu
            # off), then hand the resolved cluster on with no accelerators: one CPU replica per
            # worker.
            slurm = tf.distribute.cluster_resolver.SlurmClusterResolver(
                gpus_per_node=member.num_workers, gpus_per_task=1, auto_set_gpu=False, **ports)
            spec = slurm.cluster_spec()
            resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
                spec, task_type=slurm.task_type, task_id=slurm.task_id, num_accelerators={},
                rpc_layer=slurm.rpc_layer)
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"TensorFlow's SlurmClusterResolver cannot resolve this SLURM step "
                          f"({e}) from {slurm_env}") from None
    # It assumes block distribution and nodes that sort in node-list order: check that it put
    # this task on the node it runs on.
    node = os.environ.get("SLURMD_NODENAME")
    address = spec.task_address(resolver.task_type, resolver.task_id)
    if node and address.rpartition(":")[0] != node:
        raise ConfigError(
            f"TensorFlow's SlurmClusterResolver gives task {resolver.task_id} the address "
            f"{address}, but it runs on {node} (SLURMD_NODENAME): it numbers tasks node by node "
            f"in sorted node order ({slurm_env}); fix: srun --distribution=block (the default) "
            "on nodes whose names sort in node-list order (zero-padded numbers do)")
    return resolver


def _visible_gpus() -> bool:
    """Whether SlurmClusterResolver would find GPUs on this node. Asked as it does (from
    CUDA_VISIBLE_DEVICES, else nvidia-smi), since starting TensorFlow's GPU runtime to ask would
    make it ignore the CUDA_VISIBLE_DEVICES that the resolver then sets."""
    import shutil

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return visible.strip() not in ("", "-1")
    return shutil.which("nvidia-smi") is not None


def _kubernetes_resolver(member: cluster.Membership, port: int, client=None):
    """KubernetesClusterResolver over the pods that TFTRAIN_K8S_SELECTOR selects (their node
    IPs, sorted by pod name); this pod is worker JOB_COMPLETION_INDEX, which TensorFlow's
    resolver cannot know by itself."""
    if client is None:
        from kubernetes import client as k8s_client
        from kubernetes import config as k8s_config

        # The resolver's own client would read a kubeconfig file, which a pod does not have.
        k8s_config.load_incluster_config()
        client = k8s_client.CoreV1Api()
    selector = os.environ.get(cluster.K8S_SELECTOR) or cluster.K8S_DEFAULT_SELECTOR
    ports = {"tf_server_port": port} if port else {}
    resolver = tf.distribute.cluster_resolver.KubernetesClusterResolver(
        {"worker": [selector]}, override_client=client, **ports)
    resolver.task_type, resolver.task_id = member.task_type, member.task_index
    return resolver


def _tpu(runtime):
    """TPUClusterResolver -> connect (not for `local`) -> initialize the TPU system -> TPUStrategy.

    Every step that may wait on the network is bounded by `runtime.tpu_timeout` seconds, so a
    machine without a reachable TPU fails with one clear error instead of hanging.
    """
    tpu = runtime.tpu or "local"
    timeout = runtime.tpu_timeout
    if tpu.startswith("grpc://"):
        _check_reachable(tpu, timeout)

    def connect():
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        if tpu != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return resolver

    try:
        resolver = run_bounded(connect, timeout, "tpu-connect")
    except TimeoutError:
        raise TftrainError(
            f"TPU {tpu!r} did not answer within runtime.tpu_timeout={timeout}s (connect and "
            f"initialize). {_TPU_HINT}") from None
    except Exception as e:  # TF raises many kinds here (ValueError, OpError, URLError, ...)
        raise TftrainError(f"cannot reach TPU {tpu!r}: {_tpu_failure(e)}. {_TPU_HINT}") from None
    return tf.distribute.TPUStrategy(resolver)


_TPU_HINT = ("On a Cloud TPU VM use --tpu=local with tensorflow-tpu installed in place of "
             "tensorflow (the commands are in docs/tpu.md); for a TPU node give its name or "
             "grpc://host:8470")


def _tpu_failure(error: BaseException) -> str:
    """What a failed TPU connect means, in one line."""
    if "ConfigureDistributedTPU" in str(error) or "TPU" in type(error).__name__:
        return "no TPU devices or TPU runtime on this machine (TPU system initialization failed)"
    return first_line(error)


def _check_reachable(address: str, timeout: float) -> None:
    """A TCP connect to grpc://host:port, so an address where nothing listens fails at once."""
    import socket

    host, _, port = address[len("grpc://"):].rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--tpu={address!r} is not grpc://host:port")
    try:
        socket.create_connection((host, int(port)), timeout=min(timeout, 10)).close()
    except OSError as e:
        raise TftrainError(f"cannot reach TPU {address!r}: nothing answers at {host}:{port} "
                           f"({e.strerror or e}). {_TPU_HINT}") from None

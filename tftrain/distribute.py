"""The strategy factory: one place that turns `runtime.*` into a `tf.distribute.Strategy`.

Call `create_strategy` before any other TensorFlow op: virtual CPU devices, collective ops
(MultiWorkerMirrored) and the TPU system must be configured before the runtime starts.
"""
from __future__ import annotations

import json
import os

import tensorflow as tf
from absl import logging

from tftrain.config import RuntimeConfig
from tftrain.errors import ConfigError, TftrainError


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
    name = runtime.strategy
    if name == "auto":
        if runtime.tpu:
            name = "tpu"
        elif tf.config.list_physical_devices("GPU"):
            name = "mirrored"
        else:
            name = "one_device"
    strategy = {
        "one_device": _one_device,
        "mirrored": _mirrored,
        "multi_worker_mirrored": _multi_worker_mirrored,
        "tpu": _tpu,
    }[name](runtime)
    logging.info("strategy %s with %d replica(s)", type(strategy).__name__, strategy.num_replicas_in_sync)
    return strategy


def strategy_name(strategy: tf.distribute.Strategy) -> str:
    """The config name of a strategy instance (for summaries)."""
    return {
        "OneDeviceStrategy": "one_device",
        "MirroredStrategy": "mirrored",
        "CollectiveAllReduceStrategy": "multi_worker_mirrored",
        "MultiWorkerMirroredStrategy": "multi_worker_mirrored",
        "TPUStrategy": "tpu",
        "TPUStrategyV2": "tpu",
    }.get(type(strategy).__name__, type(strategy).__name__)


def _one_device(runtime):
    device = "/gpu:0" if tf.config.list_physical_devices("GPU") else "/cpu:0"
    return tf.distribute.OneDeviceStrategy(device)


def _mirrored(runtime):
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return tf.distribute.MirroredStrategy([d.name for d in gpus])
    cpus = tf.config.list_logical_devices("CPU")
    if runtime.cpu_devices > 1:
        return tf.distribute.MirroredStrategy([d.name for d in cpus[: runtime.cpu_devices]])
    logging.warning("strategy mirrored: no GPU and runtime.cpu_devices <= 1, so one CPU replica; "
                    "set runtime.cpu_devices=N to mirror over N virtual CPU devices")
    return tf.distribute.MirroredStrategy([cpus[0].name])


def _multi_worker_mirrored(runtime):
    tf_config = os.environ.get("TF_CONFIG")
    if not tf_config:
        raise ConfigError(
            "strategy multi_worker_mirrored needs the TF_CONFIG environment variable "
            '(e.g. {"cluster": {"worker": ["host1:port", "host2:port"]}, "task": {"type": "worker", '
            '"index": 0}}); `tftrain launch --num_workers=N -- train ...` sets it for local runs')
    try:
        parsed = json.loads(tf_config)
        workers = parsed["cluster"]["worker"]
        index = parsed["task"]["index"]
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"TF_CONFIG is not valid ({e!r}): {tf_config}") from None
    if not 0 <= int(index) < len(workers):
        raise ConfigError(f"TF_CONFIG task index {index} is outside the {len(workers)} workers")
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)


def _tpu(runtime):
    tpu = runtime.tpu or "local"
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        if tpu != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TftrainError(
            f"cannot reach TPU {tpu!r}: {first_line}. On a Cloud TPU VM use --tpu=local with "
            "tensorflow-tpu installed (pip install 'tftrain[tpu]'); for a TPU node give its name "
            "or grpc://host:8470") from None
    return tf.distribute.TPUStrategy(resolver)

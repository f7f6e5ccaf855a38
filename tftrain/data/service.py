"""tf.data service: move input processing off the training hosts.

A dispatcher (one per cluster) hands out work; workers (any number, on CPU machines) run the
input pipeline and stream ready batches to the trainers. Start them with

    tftrain data_service --dispatcher --port=5050
    tftrain data_service --worker --dispatcher_address=DISPATCHER_HOST:5050   (one per machine)

and train with `data.service_address=DISPATCHER_HOST:5050` in the config. The training input
(read, shuffle, batch, parse, decode) then runs on the service workers, which must see the same
`data.dir` (a shared filesystem or gs://); evaluation still reads locally.

Processing mode (`data.service_mode`):
- `parallel_epochs` (default): every service worker runs the whole (per-trainer-worker sharded)
  pipeline in its own random order and the trainer takes batches from all of them. Works with
  any pipeline. With k service workers a "pass" interleaves k independently shuffled streams,
  so within one epoch of steps an example may be seen more than once and another not at all.
- `distributed_epoch`: the service splits the source files among its workers, so every example
  is produced once per pass. Needs a splittable pipeline (tftrain's reader is).

Security: like multi-worker training, the service's gRPC servers have no authentication and
listen on all interfaces: run them on a private network only.
"""
from __future__ import annotations

import threading
import time

import tensorflow as tf
from absl import logging

from tftrain.errors import ConfigError

PROTOCOL = "grpc"


def service_target(address: str) -> str:
    """'host:port' (or 'grpc://host:port') -> the `service` string tf.data expects."""
    address = address.strip()
    if address.startswith(PROTOCOL + "://"):
        address = address[len(PROTOCOL) + 3:]
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"data.service_address={address!r} is not host:port (the dispatcher's)")
    return f"{PROTOCOL}://{address}"


def distribute(dataset: tf.data.Dataset, address: str, mode: str = "parallel_epochs") -> tf.data.Dataset:
    """Runs `dataset` on the tf.data service at `address`; the trainer reads its output."""
    processing_mode = {"parallel_epochs": tf.data.experimental.service.ShardingPolicy.OFF,
                       "distributed_epoch": tf.data.experimental.service.ShardingPolicy.DYNAMIC}
    if mode not in processing_mode:
        raise ConfigError(f"data.service_mode={mode!r} is not one of {', '.join(processing_mode)}")
    target = service_target(address)
    logging.info("input pipeline runs on the tf.data service at %s (%s: sharding policy %s)",
                 target, mode, processing_mode[mode].name)
    return dataset.apply(tf.data.experimental.service.distribute(
        processing_mode=processing_mode[mode], service=target))


def start_dispatcher(port: int, work_dir: str | None = None) -> tf.data.experimental.service.DispatchServer:
    """Starts a dispatcher on `port` (0: any free port). With `work_dir` (gs:// works) it
    journals its state there and recovers it after a restart."""
    config = tf.data.experimental.service.DispatcherConfig(
        port=port, protocol=PROTOCOL, work_dir=work_dir, fault_tolerant_mode=bool(work_dir))
    server = tf.data.experimental.service.DispatchServer(config)
    logging.info("tf.data service dispatcher listening on port %s (%s)", server.target.rsplit(":", 1)[-1],
                 server.target)
    return server


def start_worker(dispatcher_address: str, port: int = 0,
                 worker_address: str | None = None) -> tf.data.experimental.service.WorkerServer:
    """Starts a worker on `port` that registers with the dispatcher at `dispatcher_address`.

    `worker_address` is how the dispatcher and trainers reach this worker ("host:%port%";
    default localhost), to set when they run on other machines.
    """
    target = service_target(dispatcher_address)[len(PROTOCOL) + 3:]
    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=target, port=port, protocol=PROTOCOL, worker_address=worker_address)
    server = tf.data.experimental.service.WorkerServer(config)
    logging.info("tf.data service worker on port %s registered with dispatcher %s",
                 server._address.rsplit(":", 1)[-1], target)
    return server


def serve(servers: list, poll_seconds: float = 0.5) -> None:
    """Keeps `servers` running until interrupted, logging when their workload changes."""
    last = None
    try:
        while True:
            state = tuple(_workload(server) for server in servers)
            if state != last:
                logging.info("tf.data service: %s", "; ".join(state))
                last = state
            time.sleep(poll_seconds)
    finally:
        _stop(servers)


def _stop(servers: list, timeout: float = 10.0) -> None:
    """Stops `servers`, waiting at most `timeout` seconds: a worker's stop waits for its running
    tasks, which a trainer that went away leaves running until the dispatcher drops its job."""
    stopping = threading.Thread(target=lambda: [server._stop() for server in servers],
                                daemon=True)
    stopping.start()
    stopping.join(timeout)
    if stopping.is_alive():
        logging.warning("tf.data service: stopped without waiting for its running tasks")


def _workload(server) -> str:
    # The servers expose their load only through these (private) counters; used for logs only.
    if isinstance(server, tf.data.experimental.service.DispatchServer):
        return f"dispatcher has {server._num_workers()} worker(s)"
    return f"worker runs {server._num_tasks()} task(s)"

"""Run a tf.data service dispatcher and/or worker, so training input runs on other machines.

Start one dispatcher, then one worker per input machine; train with
`--params_override=data.service_address=DISPATCHER_HOST:PORT`. Runs until Ctrl-C / SIGTERM.
The service has no authentication: keep it on a private network.
Example: tftrain data_service --dispatcher --port=5050
         tftrain data_service --worker --dispatcher_address=localhost:5050
"""
from absl import flags

from tftrain import quiet_start

FLAGS = flags.FLAGS
flags.DEFINE_bool("dispatcher", False, "Start a dispatcher (one per cluster).")
flags.DEFINE_bool("worker", False, "Start a worker (with --dispatcher: one in the same process).")
flags.DEFINE_integer("port", 0, "The dispatcher's port (with --dispatcher), else the worker's; "
                     "0 picks a free one.", lower_bound=0)
flags.DEFINE_string("dispatcher_address", None, "host:port of the dispatcher (for --worker "
                    "without --dispatcher).")
flags.DEFINE_string("worker_address", None, "How others reach this worker, e.g. "
                    "'10.0.0.5:%port%' (default: localhost).")
flags.DEFINE_string("work_dir", None, "Dispatcher journal directory (gs:// works): restarts "
                    "recover the registered datasets and jobs.")


def main(argv):
    from tftrain.errors import ConfigError

    if not (FLAGS.dispatcher or FLAGS.worker):
        raise ConfigError("say what to start: --dispatcher, --worker, or both")
    if FLAGS.worker and not FLAGS.dispatcher and not FLAGS.dispatcher_address:
        raise ConfigError("--worker needs --dispatcher_address=host:port (or add --dispatcher)")

    quiet_start.import_tensorflow()
    from tftrain.data import service as data_service

    servers = []
    address = FLAGS.dispatcher_address
    if FLAGS.dispatcher:
        dispatcher = data_service.start_dispatcher(FLAGS.port, FLAGS.work_dir)
        servers.append(dispatcher)
        address = "localhost:" + dispatcher.target.rsplit(":", 1)[-1]
        print(f"dispatcher: {dispatcher.target}", flush=True)
    if FLAGS.worker:
        port = 0 if FLAGS.dispatcher else FLAGS.port
        worker = data_service.start_worker(address, port, FLAGS.worker_address)
        servers.append(worker)
        print(f"worker: {worker._address} -> dispatcher {address}", flush=True)
    data_service.serve(servers)
    return 0

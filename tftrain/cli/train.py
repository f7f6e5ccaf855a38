"""Train a model from a YAML experiment config.

Config is applied in this order: defaults -> --config file -> flags (--strategy, --tpu, --mesh) ->
--params_override. With no --model_dir, a new run directory under runs/ is created.
Example: tftrain train --config=digits --params_override='train.epochs=3'
"""
from absl import flags

from tftrain import native_log, quiet_start
from tftrain.cli.common import use_flags

FLAGS = flags.FLAGS
use_flags(__name__, "config", "params_override", "model_dir", "strategy", "tpu", "mesh",
          "overwrite")
flags.DEFINE_list("worker_hosts", None, "Multi-worker training without TF_CONFIG: every worker's "
                  "host:port, the same list on each worker (implies "
                  "--strategy=multi_worker_mirrored). The gRPC servers have no authentication: "
                  "use a private network.")
flags.DEFINE_integer("task_index", None, "This worker's index in --worker_hosts (0 is the chief).")


def main(argv):
    from tftrain.runtime import cluster  # no TensorFlow: TF_CONFIG must be set before it starts
    from tftrain import config as config_lib
    from tftrain.errors import ConfigError

    flag_values = {key: value for key, value in (("runtime.strategy", FLAGS.strategy),
                                                  ("runtime.tpu", FLAGS.tpu),
                                                  ("runtime.mesh", FLAGS.mesh))
                   if value is not None}
    if FLAGS.worker_hosts is not None or FLAGS.task_index is not None:
        if FLAGS.worker_hosts is None or FLAGS.task_index is None:
            raise ConfigError("--worker_hosts and --task_index go together (host:port list, index)")
        cluster.set_tf_config(FLAGS.worker_hosts, FLAGS.task_index)  # before TensorFlow starts
        flag_values.setdefault("runtime.strategy", "multi_worker_mirrored")
    config = config_lib.build_config(FLAGS.config, flag_values, FLAGS.params_override)
    convert_data = config_lib.conversion_allowed(config, FLAGS.params_override)

    # runtime.cluster (TF_CONFIG, SLURM, Kubernetes) is read and checked here, before TensorFlow.
    workers = cluster.use(config.runtime.cluster).num_workers
    if workers > 1 and not FLAGS.model_dir:
        raise ConfigError(f"multi-worker training ({workers} workers) needs --model_dir, the same "
                          "on every worker (a shared filesystem or gs://)")

    if workers > 1 and not FLAGS["verbosity"].present:
        native_log.install()  # TensorFlow's native dump of a lost peer: shown with -v only
    quiet_start.import_tensorflow()  # only after the config is valid (and TF_CONFIG is set)
    from tftrain import run_dir
    from tftrain.engine import train

    model_dir = FLAGS.model_dir or run_dir.new_run_dir(FLAGS.config)
    print(f"run directory: {model_dir}", flush=True)
    summary = train.train(config, model_dir, overwrite=FLAGS.overwrite, convert_data=convert_data)
    metrics = ", ".join(f"{k}={v:.4f}" for k, v in summary["eval"].items() if isinstance(v, float))
    print(f"{summary['eval']['split']} split: {metrics}")
    if cluster.is_chief():
        print(f"model exported to {model_dir}/export; summary in {model_dir}/summary.json")
    else:
        task_type, index = cluster.task()
        print(f"{task_type} {index} of {workers} done; the chief writes the run's files")
    return 0

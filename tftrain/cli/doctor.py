"""Say why a run is slow: time the configured run's input, model and both, and what would help.

Builds what `tftrain train` builds for the config (strategy, reader, batch size, model) and times
--steps steps of it three ways: the input alone, the model alone on a few batches replayed from
memory, and both together (input wait = 1 - combined / model alone), in 2 interleaved rounds
(the best of each counts). Truncated copies of the input (read, + parse, + decode, + the copy to
GPU/TPU replicas) find the costliest stage. Verdict: input-bound when
the model alone is at least 1.25x the input alone, else compute-bound; then up to two changes,
named by their config keys, with the speed-up measured for those it can try here (data.cache,
train.steps_per_execution). Writes nothing into a run directory; --json saves the numbers.
Example: tftrain doctor --config=digits --params_override=data.cache=decoded --json=doctor.json
--config=RUN times a run's own config (its params.yaml: its data section whole, other tools'
TFRecords included).
"""
from absl import flags

from tftrain import quiet_start
from tftrain.cli.common import use_flags
from tftrain.doctor import DEFAULT_STEPS

FLAGS = flags.FLAGS
use_flags(__name__, "config", "params_override", "json", "steps")


def main(argv):
    from tftrain.runtime import cluster
    from tftrain import config as config_lib
    from tftrain.errors import ConfigError

    config = config_lib.build_config(FLAGS.config, {}, FLAGS.params_override)
    workers = cluster.use(config.runtime.cluster).num_workers  # no TensorFlow yet
    if workers > 1:
        raise ConfigError(f"tftrain doctor runs in one process, and this environment describes "
                          f"{workers} workers (runtime.cluster={config.runtime.cluster}): run it "
                          "without TF_CONFIG (or the SLURM/Kubernetes job) to measure one worker")

    if FLAGS.steps == 0:
        raise ConfigError("--steps=0: doctor times at least 1 step per measurement "
                          f"(default {DEFAULT_STEPS})")
    quiet_start.import_tensorflow()  # only after the config is valid
    from tftrain import doctor
    from tftrain.doctor import report
    from tftrain.fileio import write_json

    result = doctor.run(config, DEFAULT_STEPS if FLAGS.steps is None else FLAGS.steps,
                        config_lib.conversion_allowed(config, FLAGS.params_override))
    print(report.text(result))
    if FLAGS.json:
        write_json(FLAGS.json, {"config": FLAGS.config, "params_override": FLAGS.params_override,
                                **result})
        print(f"numbers written to {FLAGS.json}")
    return 0

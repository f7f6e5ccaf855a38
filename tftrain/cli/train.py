"""Train a model from a YAML experiment config.

Config is applied in this order: defaults -> --config file -> flags (--strategy, --tpu) ->
--params_override. With no --model_dir, a new run directory under runs/ is created.
Example: tftrain train --config=digits --params_override='train.epochs=3'
"""
from absl import flags

from tftrain.cli.common import use_flags

FLAGS = flags.FLAGS
use_flags(__name__, "config", "params_override", "model_dir", "strategy", "tpu", "overwrite")


def main(argv):
    from tftrain import config as config_lib
    from tftrain.errors import ConfigError

    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {argv[1:]}: every option is a --flag")
    flag_values = {key: value for key, value in (("runtime.strategy", FLAGS.strategy),
                                                  ("runtime.tpu", FLAGS.tpu)) if value is not None}
    config = config_lib.build_config(FLAGS.config, flag_values, FLAGS.params_override)

    from tftrain import run_dir, train  # starts TensorFlow: only after the config is valid

    model_dir = FLAGS.model_dir or run_dir.new_run_dir(FLAGS.config)
    print(f"run directory: {model_dir}", flush=True)
    summary = train.train(config, model_dir, overwrite=FLAGS.overwrite)
    metrics = ", ".join(f"{k}={v:.4f}" for k, v in summary["eval"].items() if isinstance(v, float))
    print(f"{summary['eval']['split']} split: {metrics}")
    print(f"model exported to {model_dir}/export; summary in {model_dir}/summary.json")
    return 0

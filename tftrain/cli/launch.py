"""Run a tftrain command as N local workers of one multi-worker job, on loopback.

Each worker gets TF_CONFIG with free 127.0.0.1 ports (so `train` picks multi_worker_mirrored);
its output is shown with a `[worker i]` prefix. Exits with the chief's (worker 0's) code. If a
worker dies or fails to start, or --timeout passes, every worker is stopped and the launch
exits non-zero, naming the worker and showing its last lines. Ctrl-C / SIGTERM stop all workers.
The gRPC servers of the workers have no authentication: on a real cluster keep them on a
private network.
Example: tftrain launch --num_workers=2 --timeout=900 -- train --config=digits --model_dir=runs/mw
"""
from absl import flags

FLAGS = flags.FLAGS
ACCEPTS_ARGUMENTS = True  # the command to launch, after `--`
flags.DEFINE_integer("num_workers", 2, "How many worker processes to start.", lower_bound=1)
flags.DEFINE_float("timeout", None, "Stop everything and exit 124 after this many seconds "
                   "(default: no limit; a dead worker still ends the launch at once).")
flags.DEFINE_float("grace", 10.0, "Seconds a worker gets to exit after SIGTERM before SIGKILL.")
flags.DEFINE_bool("pin_cpus", False, "Pin worker i to CPU core i (mod the cores available).")


def main(argv):
    from tftrain import launch
    from tftrain.cli import COMMANDS
    from tftrain.errors import ConfigError

    command = argv[1:]
    if not command:
        raise ConfigError("no command to launch: write `tftrain launch --num_workers=N -- train ...`")
    if command[0] not in COMMANDS or command[0] == "launch":
        raise ConfigError(f"{command[0]!r} is not a tftrain command to launch; e.g. "
                          "`tftrain launch --num_workers=2 -- train --config=digits`")
    return launch.launch(command, FLAGS.num_workers, timeout=FLAGS.timeout, grace=FLAGS.grace,
                         pin_cpus=FLAGS.pin_cpus)

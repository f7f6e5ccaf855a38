"""Run a tftrain command as N local workers of one multi-worker job, on loopback.

Each worker gets TF_CONFIG with free 127.0.0.1 ports (so `train` picks multi_worker_mirrored);
its output is shown with a `[worker i]` prefix. Exits with the chief's (worker 0's) code. If a
worker dies or fails to start, or --timeout passes, every worker is stopped and the launch
exits non-zero, naming the worker and showing its last lines. Ctrl-C / SIGTERM stop all workers.
With --max_restarts=K, a dead worker (or, with --hang_timeout, a run without progress) stops all
workers and starts them again on fresh ports, up to K times; `train` resumes from its backup and
its summary.json counts the restarts.
The gRPC servers of the workers have no authentication: on a real cluster keep them on a
private network.
Example: tftrain launch --num_workers=2 -- train --config=digits --model_dir=runs/mw
Self-healing: tftrain launch --num_workers=2 --max_restarts=3 --hang_timeout=600 -- train ...
"""
from absl import flags

FLAGS = flags.FLAGS
ACCEPTS_ARGUMENTS = True  # the command to launch, after `--`
flags.DEFINE_integer("num_workers", 2, "How many worker processes to start.", lower_bound=1)
flags.DEFINE_float("timeout", None, "Stop everything and exit 124 after this many seconds "
                   "(default: no limit; a dead worker still ends the launch at once).")
flags.DEFINE_float("grace", 10.0, "Seconds a worker gets to exit after SIGTERM before SIGKILL.")
flags.DEFINE_bool("pin_cpus", False, "Pin worker i to CPU core i (mod the cores available).")
flags.DEFINE_integer("max_restarts", 0, "When a worker dies or the run hangs, stop all workers and "
                     "start them again (resuming from the backup), at most this many times "
                     "(0: the first failure ends the launch).", lower_bound=0)
flags.DEFINE_float("hang_timeout", None, "Treat the run as hung when no worker prints a line or "
                   "moves its training heartbeat (a step or validation step) for this many "
                   "seconds: restart it (--max_restarts) or exit 124. Must exceed the longest "
                   "silent phase (startup, dataset conversion, final evaluation and export), "
                   "e.g. 600. Default: off.")


def main(argv):
    from tftrain.runtime import launch
    from tftrain.cli import COMMANDS
    from tftrain.errors import ConfigError

    command = argv[1:]
    if not command:
        raise ConfigError("no command to launch: write `tftrain launch --num_workers=N -- train ...`")
    if command[0] not in COMMANDS or command[0] == "launch":
        raise ConfigError(f"{command[0]!r} is not a tftrain command to launch; e.g. "
                          "`tftrain launch --num_workers=2 -- train --config=digits`")
    if FLAGS.hang_timeout is not None and FLAGS.hang_timeout <= 0:
        raise ConfigError(f"--hang_timeout={FLAGS.hang_timeout:g} must be a positive number of "
                          "seconds (leave it out to turn hang detection off)")
    return launch.launch(command, FLAGS.num_workers, timeout=FLAGS.timeout, grace=FLAGS.grace,
                         pin_cpus=FLAGS.pin_cpus, max_restarts=FLAGS.max_restarts,
                         hang_timeout=FLAGS.hang_timeout)

"""Compare runs: a table of their metrics, and a PNG of their validation curves.

One row per run directory: epochs, the metrics on the evaluation (test) split and on the
validation split, steps/s, strategy and replicas, precision, and the accuracy and gzip size of the
pruned and quantized models when `tftrain prune` / `tftrain quantize` have measured them. An
unfinished run (no summary.json yet) is shown with the epochs it has recorded so far.
--output is where the PNG goes (default: report.png in the current directory; gs:// works).
Example: tftrain report runs/a runs/b --output=report.png
"""
from absl import flags

from tftrain import quiet_start
from tftrain.cli.common import use_flags

FLAGS = flags.FLAGS
ACCEPTS_ARGUMENTS = True  # the run directories
use_flags(__name__, "output")


def main(argv):
    from tftrain.errors import ConfigError

    paths = argv[1:]
    if not paths:
        raise ConfigError("no run directories given: write `tftrain report RUN [RUN...]`, e.g. "
                          "tftrain report runs/a runs/b")
    quiet_start.import_tensorflow()
    from tftrain import report

    print(report.report(paths, FLAGS.output or report.DEFAULT_OUTPUT))
    return 0

"""Show a TFRecord dataset: schema, per-split counts, shard sizes and label distribution.

--verify re-reads every record (CRC), checks each shard's sha256 and record count against
dataset.json and parses every example against the schema; on damage it names the file and the
record index and exits with a non-zero code.

Example: tftrain inspect --data=data/digits --verify
"""
from absl import flags

from tftrain import quiet_start
from tftrain.cli.common import require, use_flags

FLAGS = flags.FLAGS
use_flags(__name__, "data")
flags.DEFINE_bool("verify", False, "Check every shard and record against the manifest.")


def main(argv):
    require("data")
    quiet_start.import_tensorflow()
    from tftrain.data import inspection

    print(inspection.describe(FLAGS.data))
    if FLAGS.verify:
        print(inspection.verify_or_raise(FLAGS.data))
    return 0

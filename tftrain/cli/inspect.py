"""Show a TFRecord dataset: schema, per-split counts, shard sizes and label distribution.

Example: tftrain inspect --data=data/digits
"""
from absl import flags

from tftrain.cli.common import require, use_flags

FLAGS = flags.FLAGS
use_flags(__name__, "data")


def main(argv):
    require("data")
    from tftrain.data import manifest as manifest_lib

    manifest = manifest_lib.read(FLAGS.data)
    print(f"dataset {FLAGS.data} (pipeline {manifest['pipeline']})")
    print("features:")
    for name, feature in sorted(manifest["features"].items()):
        print(f"  {name}: {feature['dtype']} {feature['shape']}")
    for split, entry in manifest["splits"].items():
        size = sum(shard["bytes"] for shard in entry["shards"])
        print(f"{split}: {entry['num_examples']} examples in {len(entry['shards'])} shard(s), {size} bytes")
    return 0

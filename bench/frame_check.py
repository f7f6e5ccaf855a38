"""What checking a dataset's record headers costs before TensorFlow reads it.

    python bench/frame_check.py [--dir=/tmp/tftrain-frames] [--records=250000,1000000,4000000]
                                [--rounds=3]

`tftrain.data.dataset_files` walks every local shard's record headers (`record_file.check_frames`:
12 bytes per record, no data read) before a `TFRecordDataset` opens it, because TensorFlow's
reader trusts a length header (2^40 bytes crashed it). This script writes shards of 200-byte
records at several sizes, and of 100 KB records, and times side by side, best of --rounds: the
walk, and one plain `TFRecordDataset` pass over the same file (batched, no parsing: the least
any training read does). The walk's time over the pass's time is the share it adds before the
first step; records/s of the walk shows whether it stays flat as the file grows.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tftrain  # noqa: E402,F401  (tf-keras before TensorFlow)
from bench.table import markdown_table  # noqa: E402
from tftrain.data.record_file import RecordFile, check_frames  # noqa: E402
from tftrain.host import cpu_name  # noqa: E402


def shard(directory: str, records: int, size: int) -> str:
    """A TFRecord file of `records` records of `size` bytes (written once)."""
    path = os.path.join(directory, f"{records}x{size}.tfrecord")
    if not os.path.exists(path):
        with RecordFile(path + ".tmp") as f:
            for _ in range(records):
                f.write(b"r" * size)
        os.rename(path + ".tmp", path)
    return path


def best(function, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


def tf_pass(path: str) -> None:
    import tensorflow as tf

    for _ in tf.data.TFRecordDataset(path, buffer_size=1 << 20).batch(1024):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/tftrain-frames")
    parser.add_argument("--records", default="250000,1000000,4000000")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    cases = [(int(n), 200) for n in args.records.split(",")] + [(2000, 100_000)]
    rows = []
    for records, size in cases:
        path = shard(args.dir, records, size)
        assert check_frames(path) == records
        walk = best(lambda: check_frames(path), args.rounds)
        read = best(lambda: tf_pass(path), args.rounds)
        rows.append([f"{records:,} x {size:,} B", f"{os.path.getsize(path) / 2**20:,.0f}",
                     f"{walk * 1e3:,.0f}", f"{records / walk / 1e6:.2f}", f"{read * 1e3:,.0f}",
                     f"{walk / read:.2f}x"])
    print(markdown_table(["shard", "MiB", "walk ms", "walk M records/s", "TF read pass ms",
                          "walk / read"], rows, ["l", "r", "r", "r", "r", "r"]))
    print(f"\nbest of {args.rounds} rounds, files in the page cache; {cpu_name()}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

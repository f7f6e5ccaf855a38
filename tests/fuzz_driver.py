"""The fuzz test's driver process: runs seeded cases through the real CLI, in one process.

    python -m tests.fuzz_driver WORKDIR SEED FIRST COUNT

tests/test_fuzz.py forks it from the server that imported TensorFlow once (`tests/forked_cli.py`,
entry point `main`), with the same arguments after argv[0]: a fresh interpreter would spend
seconds importing TensorFlow again, and each start after a crash or a hang would too.

Each case `i` is generated from (SEED, i) alone, so any case replays by itself
(`TFTRAIN_FUZZ_SEED=S TFTRAIN_FUZZ_FIRST=i TFTRAIN_FUZZ_CASES=1 pytest tests/test_fuzz.py`).
For each case the driver prints one JSON line when it starts (what it mutated) and one when it
ends (exit code, stderr, and `problem` when the result was wrong: an exit 0 on damage, or for
content cases an error on sound content); the test
(tests/test_fuzz.py) times each case, restarts the driver after a crash or a hang, and checks
the sentinel directory outside every target after every case.
"""
from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import random
import shutil
import struct
import sys
import tempfile
import traceback

KINDS = ("manifest", "shard", "yaml", "csv", "jsonl", "content")
TRAIN_EVERY = 6  # one damaged-dataset case in this many also trains on it (the costly read)
LABEL, IMAGE = "image/class/label", "image/encoded"
VALUES = [-5, 1e18, 10**18, 2**63, None, "", "x", "../../sentinel/keep.txt", "/etc/passwd", [], {},
          True, 0, 1, -1, 3.5, "ünï\u2028", [[[[[]]]]], {"a": {"b": {}}}, "train", "int64",
          "complex128", 10**9]


def build_bases(work: str) -> dict:
    """The undamaged inputs every case copies: a digits dataset, a config, a CSV, a JSONL."""
    from pipelines import load_pipeline
    from tftrain.data.writer import write_dataset

    bases = os.path.join(work, "bases")
    dataset = os.path.join(bases, "digits")
    if not os.path.exists(os.path.join(dataset, "dataset.json")):
        write_dataset(load_pipeline("digits"), "", dataset, progress=False)
    rows = ["a,b,c,label"] + [f"{i * 0.5},{i % 7},{'xyz'[i % 3]},{i % 3}" for i in range(60)]
    texts = [json.dumps({"text": f"word{i % 5} other{i % 3} text", "label": i % 3})
             for i in range(60)]
    files = {"table.csv": "\n".join(rows) + "\n", "rows.jsonl": "\n".join(texts) + "\n",
             "tiny.yaml": ("data:\n  dir: DATA\n  batch_size: 32\nmodel:\n  name: mlp\n  params: "
                           "{hidden_units: [8]}\ntrain:\n  epochs: 1\n  steps_per_epoch: 2\n")}
    for name, text in files.items():
        with open(os.path.join(bases, name), "w") as f:
            f.write(text)
    text = os.path.join(bases, "text")  # token windows: the content cases' token ids
    if not os.path.exists(os.path.join(text, "dataset.json")):
        write_dataset(load_pipeline("text", sequence_length=32), "", text, progress=False,
                      num_shards=1, workers=1)
    run = os.path.join(bases, "run")  # the model content cases evaluate, prune and quantize
    if not os.path.exists(os.path.join(run, "summary.json")):
        with captured_output(run + ".out", run + ".err"):
            code = cli("train", f"--config={os.path.join(bases, 'tiny.yaml')}",
                       f"--model_dir={run}",
                       f"--params_override=data.dir={dataset},train.steps_per_epoch=20")
        assert code == 0, "the content cases' model did not train"
    return {"dataset": dataset, "run": run, "text": text,
            **{name: os.path.join(bases, name) for name in files}}


# ---- mutators: each takes the case's rng and returns a description ---------------------------

def mutate_manifest(rng: random.Random, path: str) -> str:
    text = open(path, encoding="utf-8").read()
    how = rng.choice(["value", "value", "value", "delete", "bytes", "truncate", "nest", "special"])
    if how == "special":  # a read that would block (FIFO) or never end (/dev/zero)
        os.remove(path)
        fifo = rng.random() < 0.5
        os.mkfifo(path) if fifo else os.symlink("/dev/zero", path)
        return "manifest replaced by " + ("a FIFO" if fifo else "a link to /dev/zero")
    if how == "bytes":
        data = bytearray(text.encode())
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        open(path, "wb").write(bytes(data))
        return "manifest bytes changed"
    if how == "truncate":
        cut = rng.randrange(len(text))
        open(path, "w").write(text[:cut])
        return f"manifest cut at {cut}"
    if how == "nest":
        depth = rng.choice([100, 10_000, 200_000])
        open(path, "w").write(text.rstrip()[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}")
        return f"manifest nested {depth} deep"
    manifest = json.loads(text)
    parent, key = _random_slot(rng, manifest)
    if how == "delete":
        parent.pop(key) if isinstance(parent, dict) else parent.pop(key)
        described = f"deleted {key!r}"
    else:
        value = rng.choice(VALUES)
        parent[key] = value
        described = f"set {key!r} to {value!r}"
    open(path, "w").write(json.dumps(manifest))
    return "manifest " + described


def _random_slot(rng: random.Random, tree):
    """A (container, key) inside `tree`, deeper ones as likely as shallow ones."""
    slots, stack = [], [tree]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(
            node, list) else ()
        for key, child in items:
            slots.append((node, key))
            if isinstance(child, (dict, list)) and len(slots) < 5000:
                stack.append(child)
    return rng.choice(slots)


def mutate_shard(rng: random.Random, dataset: str, sentinel: str) -> str:
    from tftrain.data.record_file import masked_crc32c

    manifest = json.load(open(os.path.join(dataset, "dataset.json")))
    split = rng.choice(sorted(manifest["splits"]))
    path = os.path.join(dataset, manifest["splits"][split]["shards"][0]["file"])
    data = bytearray(open(path, "rb").read())
    how = rng.choice(["flip", "flip", "truncate", "huge", "huge", "zero", "append", "link_dir",
                      "link_file", "dev_zero", "fifo", "directory", "duplicate"])
    if how in ("link_dir", "link_file", "dev_zero", "fifo", "directory"):
        os.remove(path)
        if how == "fifo":
            os.mkfifo(path)
        elif how == "directory":
            os.mkdir(path)
        else:
            os.symlink({"link_dir": sentinel, "link_file": os.path.join(sentinel, "keep.txt"),
                        "dev_zero": "/dev/zero"}[how], path)
        return f"{split} shard replaced: {how}"
    if how == "flip":
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif how == "truncate":
        del data[rng.randrange(len(data)):]
    elif how == "huge":
        length = struct.pack("<Q", rng.choice([1 << 40, 1 << 62, len(data), 2**64 - 1]))
        data[0:12] = length + masked_crc32c(length)
    elif how == "zero":
        data = bytearray()
    elif how == "append":
        data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
    else:
        data.extend(bytes(data))
    open(path, "wb").write(bytes(data))
    return f"{split} shard: {how}"


def mutate_text(rng: random.Random, path: str, kind: str) -> str:
    raw = bytearray(open(path, "rb").read())
    how = rng.choice(["quote", "quote", "huge", "bytes", "nul", "line", "label", "delete_line",
                      "empty", "cr", "alias_bomb" if kind == "yaml" else "deep"])
    at = rng.randrange(len(raw))
    if how == "quote":
        raw[at:at] = b'"'
    elif how == "huge":
        raw[at:at] = b"x" * rng.choice([1000, 200_000])
    elif how == "bytes":
        raw[at:at] = bytes([rng.choice([0x80, 0xff, 0xfe, 0xc3])])
    elif how == "nul":
        raw[at:at] = b"\0"
    elif how == "line":
        raw[at:at] = rng.choice([b"\n,,,\n", b"\n{\n", b"\n- a\n", b"\n1,2\n", b"\n[1]\n"])
    elif how == "label":
        raw[at:at] = rng.choice([b"100000000", b"-7", b"1e400", b"nan", b"2.5"])
    elif how == "delete_line":
        lines = bytes(raw).split(b"\n")
        del lines[rng.randrange(len(lines))]
        raw = bytearray(b"\n".join(lines))
    elif how == "empty":
        raw = bytearray()
    elif how == "cr":
        raw = bytearray(bytes(raw).replace(b"\n", b"\r"))
    elif how == "alias_bomb":
        raw += (b"extra:\n  a: &a [x, x, x, x, x, x, x, x, x, x]\n"
                + b"".join(b"  %s: &%s [%s]\n" % (n, n, b", ".join([b"*" + p] * 10))
                           for p, n in zip([b"a", b"b", b"c", b"d", b"e", b"f", b"g"],
                                           [b"b", b"c", b"d", b"e", b"f", b"g", b"h"])))
    else:
        raw[at:at] = b"[" * 100_000
    open(path, "wb").write(bytes(raw))
    return f"{kind}: {how} at byte {at}"


def plant_links(rng: random.Random, directory: str, sentinel: str) -> str:
    """Plants links to the sentinel where tftrain might delete or write (a run's logs/ and
    backup/, a conversion's marker and shard names)."""
    os.makedirs(directory, exist_ok=True)
    name = rng.choice(["logs", "backup", "checkpoints", "export", "train-00000-of-00001.tfrecord",
                       "bad_rows.jsonl", ".convert.lock", ".tftrain-run.lock"])
    os.symlink(sentinel, os.path.join(directory, name))
    if rng.random() < 0.5:
        with open(os.path.join(directory, ".tftrain-convert.json"), "w") as f:
            json.dump({"format": "tftrain.convert/1", "run_id": "x", "pid": 1, "files": [name]}, f)
    return f"planted {name} -> sentinel"


# ---- checks of an exit 0 -------------------------------------------------------------------

def dataset_problem(dataset: str) -> str | None:
    """Why `dataset` is not intact (its files against its manifest, checked independently of
    tftrain's own verify), or None."""
    from tftrain.data.record_file import check_frames

    try:
        manifest = json.load(open(os.path.join(dataset, "dataset.json"), encoding="utf-8"))
        for name, split in manifest["splits"].items():
            total = 0
            for shard in split["shards"]:
                path = os.path.join(dataset, shard["file"])
                if os.path.islink(path) or not os.path.isfile(path):
                    return f"{name}: {shard['file']} is not a regular file"
                data = open(path, "rb").read()
                if len(data) != shard["bytes"] or hashlib.sha256(data).hexdigest() != shard["sha256"]:
                    return f"{name}: {shard['file']} differs from its manifest entry"
                if check_frames(path) != shard["num_examples"]:
                    return f"{name}: {shard['file']} holds another number of records"
                total += shard["num_examples"]
            if total != split["num_examples"] or type(total) is not int:
                return f"{name}: num_examples {split['num_examples']!r} != {total}"
    except Exception as e:  # noqa: BLE001  (anything unreadable is not intact)
        return f"not intact: {type(e).__name__}: {e}"
    return None


def rows_problem(source: str, dataset: str, kind: str) -> str | None:
    """For JSONL, every non-blank line is a row: examples + bad rows must account for all."""
    problem = dataset_problem(dataset)
    if problem or kind != "jsonl":
        return problem
    lines = [line for line in open(source, "rb").read().split(b"\n") if line.strip()]
    manifest = json.load(open(os.path.join(dataset, "dataset.json")))
    examples = sum(s["num_examples"] for s in manifest["splits"].values())
    bad = manifest.get("bad_rows", {}).get("count", 0)
    if examples + bad != len(lines):
        return f"{len(lines)} rows in, {examples} examples + {bad} bad rows out"
    return None


def when_ok(problem, *args):
    """A command's check that asks `problem(*args)` of an exit 0 only."""
    return lambda code, stderr: problem(*args) if code == 0 else None


# ---- running one case ----------------------------------------------------------------------

@contextlib.contextmanager
def captured_output(stdout_path: str, stderr_path: str):
    """Sends fds 1 and 2 (what the command prints, absl's and TensorFlow's logs) to files for
    the block: the driver's own stdout carries only its JSON lines (`PROTOCOL`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(stderr_path, "w") as err, open(stdout_path, "w") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


PROTOCOL = sys.stdout


def say(message: dict) -> None:
    """One JSON line to the test."""
    PROTOCOL.write(json.dumps(message) + "\n")
    PROTOCOL.flush()


def cli(*args: str) -> int:
    """`tftrain <args>` in this process: its exit code; an exception that escapes it is printed
    as the traceback a user would see (and fails the case)."""
    from tftrain.cli import run

    try:
        run(["tftrain", *args])
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return 1
    return 0


def dataset_case(rng, index, kind, bases, case_dir, sentinel):
    """A damaged copy of the digits dataset: inspect --verify it, and train on it now and then."""
    dataset = os.path.join(case_dir, "digits")
    shutil.copytree(bases["dataset"], dataset)
    what = (mutate_manifest(rng, os.path.join(dataset, "dataset.json")) if kind == "manifest"
            else mutate_shard(rng, dataset, sentinel))
    commands = [(("inspect", f"--data={dataset}", "--verify"), when_ok(dataset_problem, dataset))]
    if index % TRAIN_EVERY == 0:
        run = os.path.join(case_dir, "run")
        what += "; " + plant_links(rng, run, sentinel)
        commands.append((("train", f"--config={bases['tiny.yaml']}", f"--model_dir={run}",
                          f"--params_override=data.dir={dataset}"), None))
    return what, commands


def config_case(rng, index, kind, bases, case_dir, sentinel):
    """A damaged copy of a small config: `tftrain check` it."""
    config = os.path.join(case_dir, "c.yaml")
    with open(bases["tiny.yaml"]) as f:
        open(config, "w").write(f.read().replace("DATA", bases["dataset"]))
    return mutate_text(rng, config, kind), [(("check", f"--config={config}", "--target=cpu"), None)]


def rows_case(rng, index, kind, bases, case_dir, sentinel):
    """A damaged copy of a CSV or JSONL file: convert it, sometimes into a trapped directory."""
    source = os.path.join(case_dir, "table.csv" if kind == "csv" else "rows.jsonl")
    shutil.copy(bases[os.path.basename(source)], source)
    what = mutate_text(rng, source, kind)
    out = os.path.join(case_dir, "out")
    if rng.random() < 0.3:
        what += "; " + plant_links(rng, out, sentinel)
    command = ("convert", f"--pipeline={kind}", f"--input={source}", f"--output={out}",
               "--workers=1", "--max_bad_fraction=0.5")
    return what, [(command, when_ok(rows_problem, source, out, kind))]


# ---- content damage: records that parse as frames (valid checksums, a manifest whose sizes and
# sha256 match) but whose content is wrong -------------------------------------------------------

RECORD_CHANGES = ("label", "label", "label_float", "label_missing", "labels_two", "image_short",
                  "image_long", "image_ints", "image_missing", "garbage", "empty", "extra_feature")


def mutate_record(rng: random.Random, record: bytes) -> tuple[bytes, str]:
    """One digits record changed in content (a protobuf edit, no TensorFlow op): the new bytes
    and what changed."""
    from tensorflow.core.example import example_pb2

    example = example_pb2.Example.FromString(record)
    features = example.features.feature
    how = rng.choice(RECORD_CHANGES)
    if how == "label":
        value = rng.choice([10, 999, -1, -2**63, 2**63 - 1, 3, 0])
        features[LABEL].int64_list.value[:] = [value]
        how = f"label {value}"
    elif how == "label_float":
        del features[LABEL]
        features[LABEL].float_list.value[:] = [3.0]
    elif how == "labels_two":
        features[LABEL].int64_list.value[:] = [1, 2]
    elif how in ("label_missing", "image_missing"):
        del features[LABEL if how == "label_missing" else IMAGE]
    elif how in ("image_short", "image_long"):
        pixels = features[IMAGE].bytes_list.value[0]
        features[IMAGE].bytes_list.value[0] = (
            pixels[:rng.randrange(len(pixels))] if how == "image_short"
            else pixels + bytes(rng.randint(1, 64)))
    elif how == "image_ints":
        del features[IMAGE]
        features[IMAGE].int64_list.value[:] = [1] * 64
    elif how == "extra_feature":
        features["zz/extra"].float_list.value[:] = [1.0, 2.0]
    else:
        return (b"" if how == "empty" else
                bytes(rng.randrange(256) for _ in range(rng.randint(1, 80)))), how
    return example.SerializeToString(), how


TOKEN_CHANGES = ("past", "past", "negative", "huge", "float", "short", "long", "missing",
                 "garbage", "valid")


def mutate_tokens(rng: random.Random, record: bytes, vocab: int) -> tuple[bytes, str]:
    """One token window changed in content: the new bytes and what changed."""
    from tensorflow.core.example import example_pb2

    example = example_pb2.Example.FromString(record)
    tokens = example.features.feature["tokens"]
    ids = list(tokens.int64_list.value)
    at = rng.randrange(len(ids))
    how = rng.choice(TOKEN_CHANGES)
    if how in ("past", "negative", "huge", "valid"):
        ids[at] = {"past": vocab + rng.randrange(1000), "negative": -1, "huge": 2**62,
                   "valid": 5}[how]
        tokens.int64_list.value[:] = ids
        how = f"token {at} = {ids[at]}"
    elif how == "float":
        del example.features.feature["tokens"]
        example.features.feature["tokens"].float_list.value[:] = [float(i) for i in ids]
    elif how in ("short", "long"):
        tokens.int64_list.value[:] = ids[:at] if how == "short" else ids + [5] * (at + 1)
    elif how == "missing":
        del example.features.feature["tokens"]
    else:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 80))), how
    return example.SerializeToString(), how


def split_records(dataset: str, split: str) -> tuple[str, list[bytes]]:
    """The path of `split`'s first shard and its records (read with tftrain's own framing
    reader's format, by hand: length, its CRC, data, its CRC)."""
    manifest = json.load(open(os.path.join(dataset, "dataset.json")))
    path = os.path.join(dataset, manifest["splits"][split]["shards"][0]["file"])
    data, records, at = open(path, "rb").read(), [], 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at:at + 8])
        records.append(data[at + 12:at + 12 + length])
        at += 12 + length + 4
    return path, records


def write_records(dataset: str, split: str, path: str, records: list[bytes],
                  recount: bool) -> None:
    """`records` written to `path` with valid checksums (tftrain's own `RecordFile`); the
    manifest's size and sha256 of the shard updated, and with `recount` its label counts too
    (a manifest consistent with the damage)."""
    from tftrain.data.record_file import RecordFile

    with RecordFile(path) as shard:
        for record in records:
            shard.write(record)
    manifest_path = os.path.join(dataset, "dataset.json")
    manifest = json.load(open(manifest_path))
    entry = manifest["splits"][split]
    entry["shards"][0]["bytes"], entry["shards"][0]["sha256"] = shard.close()
    if recount:
        labels = [_label(record) for record in records]
        counts = collections.Counter(str(label) for label in labels if label is not None)
        entry["label_counts"] = dict(sorted(counts.items()))
    json.dump(manifest, open(manifest_path, "w"))


def _label(record: bytes):
    """A record's one int64 label, or None (not an Example, no label, another type, several)."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.example import example_pb2

    try:
        feature = example_pb2.Example.FromString(record).features.feature.get(LABEL)
    except DecodeError:
        return None
    values = feature.int64_list.value if feature is not None else []
    return values[0] if len(values) == 1 else None


def content_problem(dataset: str, splits, counts: bool) -> str | None:
    """The first record of `splits` that a model cannot take, checked here with protobuf alone
    (one int64 label in [0, num_classes), one image of exactly its pixels' bytes), and with
    `counts` a split whose records' labels disagree with the manifest's label_counts; or None."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.example import example_pb2

    manifest = json.load(open(os.path.join(dataset, "dataset.json")))
    if "tokens" in manifest["features"]:
        return tokens_problem(dataset, manifest, splits)
    classes = manifest["info"]["num_classes"]
    pixels = 1
    for size in manifest["info"]["image_size"]:
        pixels *= size
    for split in splits:
        _, records = split_records(dataset, split)
        for index, record in enumerate(records):
            label = _label(record)
            try:
                image = example_pb2.Example.FromString(record).features.feature.get(IMAGE)
            except DecodeError:
                image = None
            images = image.bytes_list.value if image is not None else []
            if label is None or not 0 <= label < classes or len(images) != 1 or len(
                    images[0]) != pixels:
                return f"{split} record {index} cannot be trained on"
        if counts:
            found = collections.Counter(str(_label(r)) for r in records)
            if dict(found) != manifest["splits"][split].get("label_counts"):
                return f"{split}: label counts differ from the manifest's"
    return None


def tokens_problem(dataset: str, manifest: dict, splits) -> str | None:
    """The first token window of `splits` a language model cannot take (checked with protobuf
    alone: one int64 list of the schema's length, every id in [0, vocab_size)), or None."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.example import example_pb2

    vocab, (length,) = manifest["info"]["vocab_size"], manifest["features"]["tokens"]["shape"]
    for split in splits:
        for index, record in enumerate(split_records(dataset, split)[1]):
            try:
                feature = example_pb2.Example.FromString(record).features.feature.get("tokens")
            except DecodeError:
                feature = None
            ids = list(feature.int64_list.value) if feature is not None else []
            if len(ids) != length or not all(0 <= i < vocab for i in ids):
                return f"{split} record {index} cannot be trained on"
    return None


def content_check(dataset: str, splits, counts: bool = False):
    """A case's check of one command: an exit 0 on damage the command reads, or an error on
    content that is sound (other than prune's or quantize's accuracy gate), is a wrong result."""
    def check(code: int, stderr: str) -> str | None:
        problem = content_problem(dataset, splits, counts)
        if code == 0 and problem:
            return f"exit 0 on damaged content: {problem}"
        if code != 0 and not problem and "lost too much" not in stderr:
            last = stderr.strip().splitlines()[-1:] or [""]
            return f"exit {code} on sound content: {last[0][-300:]}"
        return None
    return check


def run_for(bases: dict, case_dir: str, dataset: str) -> str:
    """A copy of the bases' trained run whose config points at `dataset` (what prune and
    quantize measure on)."""
    import yaml

    run = os.path.join(case_dir, "trained")
    shutil.copytree(bases["run"], run, ignore=shutil.ignore_patterns("backup", "logs"))
    params = os.path.join(run, "params.yaml")
    config = yaml.safe_load(open(params))
    config["data"]["dir"] = dataset
    yaml.safe_dump(config, open(params, "w"))
    return run


def content_case(rng, index, kind, bases, case_dir, sentinel):
    """A copy of the digits dataset (a quarter of the cases: of the token windows,
    `tokens_case`) with one record of its validation or test split changed in content and
    framed validly: inspect --verify it, then (by the case's index) train on it, evaluate,
    prune or quantize the trained model on it."""
    if rng.random() < 0.25:
        return tokens_case(rng, index, bases, case_dir)
    dataset = os.path.join(case_dir, "digits")
    shutil.copytree(bases["dataset"], dataset)
    split = rng.choice(["validation", "test"])
    path, records = split_records(dataset, split)
    at = rng.randrange(len(records))
    records[at], how = mutate_record(rng, records[at])
    recount = rng.random() < 0.5
    write_records(dataset, split, path, records, recount)
    what = f"{split} record {at}: {how}" + ("; label counts recounted" if recount else "")
    commands = [(("inspect", f"--data={dataset}", "--verify"),
                 content_check(dataset, ["train", "validation", "test"], counts=True))]
    which = index % 16  # the costly reads in some cases only (the suite's CPU budget)
    if which == 0:
        commands.append((("train", f"--config={bases['tiny.yaml']}",
                          f"--model_dir={os.path.join(case_dir, 'run')}",
                          f"--params_override=data.dir={dataset}"),
                         content_check(dataset, ["validation", "test"])))
    elif which in (4, 12):
        commands.append((("evaluate", f"--model={os.path.join(bases['run'], 'export')}",
                          f"--data={dataset}", f"--split={split}"),
                         content_check(dataset, [split])))
    elif which in (2, 10):
        command = (("prune", "--epochs=1", "--min_weights_to_prune=1") if which == 2
                   else ("quantize", "--mode=dynamic"))
        commands.append(((*command, f"--model_dir={run_for(bases, case_dir, dataset)}",
                          f"--split={split}"), content_check(dataset, [split])))
    return what, commands



def tokens_case(rng, index, bases, case_dir):
    """A copy of the token windows with one window of its validation or test split changed in
    content, framed validly: inspect --verify it, and now and then train a small language model
    on it."""
    dataset = os.path.join(case_dir, "text")
    shutil.copytree(bases["text"], dataset)
    split = rng.choice(["validation", "test"])
    path, records = split_records(dataset, split)
    at = rng.randrange(len(records))
    vocab = json.load(open(os.path.join(dataset, "dataset.json")))["info"]["vocab_size"]
    records[at], how = mutate_tokens(rng, records[at], vocab)
    write_records(dataset, split, path, records, recount=False)
    commands = [(("inspect", f"--data={dataset}", "--verify"),
                 content_check(dataset, ["train", "validation", "test"]))]
    if index % 8 == 0:
        commands.append((("train", "--config=text_lm", f"--model_dir={case_dir}/run",
                          f"--params_override=data.dir={dataset},model.params={{width: 16, "
                          "num_layers: 1, num_heads: 2, mlp_width: 32},train.epochs=1,"
                          "train.steps_per_epoch=2"),
                         content_check(dataset, ["validation", "test"])))
    return f"{split} window {at}: {how}", commands


CASES = {"manifest": dataset_case, "shard": dataset_case, "yaml": config_case,
         "csv": rows_case, "jsonl": rows_case, "content": content_case}


def run_case(index: int, seed: int, bases: dict, work: str, sentinel: str,
             configs_run: dict) -> None:
    """Builds case `index` from (seed, index), runs its commands, says what happened. A command
    that exits 0 has its result checked by the case's own check (None: nothing to check).

    A config case whose file has the bytes of one already run in this driver (`configs_run`: its
    sha256 -> (case, results); e.g. every `cr` or `empty` mutation of the same config) says
    that case's results instead of checking the same input again."""
    rng = random.Random(f"{seed}:{index}")
    kind = KINDS[rng.randrange(len(KINDS))]
    case_dir = tempfile.mkdtemp(prefix=f"case{index}-", dir=work)
    what, commands = CASES[kind](rng, index, kind, bases, case_dir, sentinel)
    digest = None
    if kind == "yaml":
        with open(os.path.join(case_dir, "c.yaml"), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    if digest in configs_run:
        earlier, results = configs_run[digest]
        say({"case": index, "event": "start", "kind": kind,
             "what": f"{what} (the bytes of case {earlier}: its results)"})
    else:
        say({"case": index, "event": "start", "kind": kind, "what": what})
        results = run_commands(commands, case_dir)
        if digest:
            configs_run[digest] = index, results
    say({"case": index, "event": "end", "results": results})
    shutil.rmtree(case_dir, ignore_errors=True)  # its links are unlinked, never followed


def run_commands(commands, case_dir: str) -> list[dict]:
    """Each (command, check) of a case run in this process (its output kept in `case_dir`):
    its exit code, output and the problem its check finds."""
    results = []
    for command, check in commands:
        err_path = os.path.join(case_dir, "stderr.txt")
        out_path = os.path.join(case_dir, "stdout.txt")
        with captured_output(out_path, err_path):
            code = cli(*command)
        stderr = open(err_path, errors="replace").read()
        stdout = open(out_path, errors="replace").read()
        problem = check(code, stderr) if check else None
        results.append({"command": command[0], "code": code, "stderr": stderr[-20000:],
                        "stdout": stdout[-2000:], "problem": problem})
    return results


def main(argv: list[str]) -> None:
    work, seed, first, count = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tftrain  # noqa: F401  (tf-keras before TensorFlow)

    bases = build_bases(work)
    from tests.conftest import fewer_collections

    fewer_collections()
    say({"event": "ready"})
    sentinel = os.path.join(work, "sentinel")
    configs_run = {}
    for index in range(first, first + count):
        run_case(index, seed, bases, work, sentinel, configs_run)


if __name__ == "__main__":
    main(sys.argv)

"""Split and shard assignment (`tftrain.data.splits`): pure functions of a row's key, checked
against the definition (sha256 of `salt NUL key`, its first 8 bytes over 2^64) and at the
boundaries. Fast; `make mutation` runs them."""
import hashlib

import pytest

from tftrain.data.splits import assign_shard, assign_split, parse_splits, split_of, unit_hash
from tftrain.errors import ConfigError

KEYS = [f"row/{i:05d}" for i in range(2000)]


def spec_hash(key: str, salt: str = "") -> float:
    digest = hashlib.sha256(salt.encode() + b"\x00" + key.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def test_unit_hash_is_sha256_of_salt_and_key_over_2_to_the_64():
    assert unit_hash("row/00001", "split") == spec_hash("row/00001", "split")
    assert unit_hash("row/00001") == unit_hash("row/00001", "") == spec_hash("row/00001")
    # Pinned: a dataset converted by an older tftrain must split the same way.
    assert unit_hash("a", "split") == 0.5490854188088543
    values = [unit_hash(key) for key in KEYS]
    assert all(0 <= v < 1 for v in values) and 0.45 < sum(values) / len(values) < 0.55


def test_parse_splits_reads_name_fraction_pairs():
    assert parse_splits("train:0.8,validation:0.1,test:0.1") == {
        "train": 0.8, "validation": 0.1, "test": 0.1}
    assert list(parse_splits(" b:0.25 , a:0.75 ,")) == ["b", "a"]  # spaces, order, empty part
    assert parse_splits("all:1") == {"all": 1.0}  # 1 is a fraction
    assert parse_splits("a:0.5,b:0.5000001") == {"a": 0.5, "b": 0.5000001}  # within 1e-6 of 1


@pytest.mark.parametrize("text", ["train", ":1", "train:0", "train:1.5", "train:-0.5",
                                  "train:abc", "a:b:1", "train:"])
def test_a_bad_split_is_refused(text):
    with pytest.raises(ConfigError) as raised:
        parse_splits(text)
    assert str(raised.value) == (
        f"bad split {text!r} in {text!r}: write name:fraction with 0 < fraction <= 1, "
        "e.g. train:0.8,validation:0.1,test:0.1")


@pytest.mark.parametrize("text, total", [("a:0.5,b:0.6", "1.1"), ("a:0.5,b:0.4", "0.9"),
                                         ("", "0"), (",", "0")])
def test_fractions_must_sum_to_1(text, total):
    with pytest.raises(ConfigError) as raised:
        parse_splits(text)
    assert str(raised.value) == f"split fractions in {text!r} sum to {total}, not 1."


def spec_split(key, fractions):
    point, edge = spec_hash(key, "split"), 0.0
    for name, fraction in fractions.items():
        edge += fraction
        if point < edge:
            return name
    return list(fractions)[-1]


def test_assign_split_cuts_0_1_in_the_order_of_the_fractions():
    fractions = {"train": 0.5, "validation": 0.3, "test": 0.2}
    got = [assign_split(key, fractions) for key in KEYS]
    assert got == [spec_split(key, fractions) for key in KEYS]
    assert {name: got.count(name) for name in fractions} == {
        "train": 1000, "validation": 597, "test": 403}
    # The edges are half-open: a point exactly on an edge belongs to the split above it.
    point = unit_hash(KEYS[0], "split")
    assert assign_split(KEYS[0], {"below": point, "above": 1 - point}) == "above"
    assert assign_split(KEYS[0], {"below": point + 1e-12, "above": 1 - point}) == "below"


def test_assign_split_gives_the_last_split_past_the_top():
    # Fractions that add up to a little less than 1 (rounding): the rest goes to the last.
    assert {assign_split(key, {"only": 1e-9}) for key in KEYS} == {"only"}
    assert {assign_split(key, {"a": 1e-9, "b": 1e-9}) for key in KEYS} == {"b"}


def test_split_of_keeps_the_source_split_unless_resplit():
    defaults = {"train": 1.0}
    assert split_of("k", "test", None, defaults) == "test"
    assert split_of("k", "test", {}, defaults) == "test"
    assert split_of("k", "test", {"x": 1.0}, defaults) == "x"  # --splits re-splits every row
    assert split_of("k", None, None, defaults) == "train"  # no source split: the defaults
    assert split_of("k", "", None, {"d": 1.0}) == "d"
    assert split_of("k", None, {"x": 1.0}, defaults) == "x"


def test_assign_shard_spreads_by_key_and_seed():
    for seed in (0, 7):
        got = [assign_shard(key, 5, seed) for key in KEYS]
        assert got == [int(spec_hash(key, f"shard{seed}") * 5) for key in KEYS]
        assert sorted(set(got)) == [0, 1, 2, 3, 4]
    assert [assign_shard(key, 5, 0) for key in KEYS] != [assign_shard(key, 5, 7) for key in KEYS]
    assert {assign_shard(key, 1, 3) for key in KEYS} == {0}

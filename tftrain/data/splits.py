"""Deterministic split and shard assignment from each row's stable key."""
from __future__ import annotations

import hashlib

from tftrain.errors import ConfigError


def parse_splits(text: str) -> dict[str, float]:
    """Parses 'train:0.8,validation:0.1,test:0.1' into fractions that sum to 1."""
    fractions: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition(":")
        try:
            fraction = float(value)
        except ValueError:
            fraction = -1.0
        if not sep or not name or not 0 < fraction <= 1:
            raise ConfigError(
                f"bad split {part!r} in {text!r}: write name:fraction with 0 < fraction <= 1, "
                "e.g. train:0.8,validation:0.1,test:0.1")
        fractions[name.strip()] = fraction
    if not fractions or abs(sum(fractions.values()) - 1.0) > 1e-6:
        raise ConfigError(f"split fractions in {text!r} sum to {sum(fractions.values()):g}, not 1.")
    return fractions


def unit_hash(key: str, salt: str = "") -> float:
    """A number in [0, 1) that depends only on `salt` and `key`."""
    digest = hashlib.sha256(f"{salt}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def assign_split(key: str, fractions: dict[str, float]) -> str:
    """The split of a row: stable for a key, so adding rows never moves the others."""
    point, edge = unit_hash(key, "split"), 0.0
    for name, fraction in fractions.items():
        edge += fraction
        if point < edge:
            return name
    return name  # rounding at the very top of [0, 1)


def split_of(key: str, source_split: str | None, fractions: dict[str, float] | None,
             default_fractions: dict[str, float]) -> str:
    """The split the converter puts a row in: its source split, unless `fractions` (--splits)
    re-split every row by its key; a row without a source split by `default_fractions`."""
    if source_split and not fractions:
        return source_split
    return assign_split(key, fractions or default_fractions)


def assign_shard(key: str, num_shards: int, seed: int) -> int:
    """The shard of a row within its split, spread evenly and reproducibly by `seed`."""
    return int(unit_hash(key, f"shard{seed}") * num_shards)

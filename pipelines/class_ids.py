"""How many classes integer labels make: their largest id + 1, within reason.

Integer labels are class ids 0..K-1, so one stray id (a row labelled 100000000 among labels
0, 1, 2) would make a head of 100 million classes: gigabytes of weights, most never trained.
Ids far sparser than any real labelling are refused at conversion, naming the row.
"""
from __future__ import annotations

from tftrain.errors import ConfigError

# More ids than this many per distinct label, and more than MIN_REFUSED in all: not class ids.
MAX_IDS_PER_LABEL = 100
MIN_REFUSED = 100_000


def num_classes(max_id: int, distinct: int, where: str) -> int:
    """`max_id + 1`, the class count of integer labels with `distinct` different values;
    raises ConfigError naming `where` (the row with `max_id`) when the ids are too sparse."""
    count = max_id + 1
    if count > MIN_REFUSED and count > MAX_IDS_PER_LABEL * max(distinct, 1):
        raise ConfigError(
            f"label {max_id} ({where}) would make {count:,} classes for {distinct:,} distinct "
            "labels: integer labels are class ids 0..K-1. Fix or drop that row, renumber the "
            "classes, or write the labels as class names (strings).")
    return count

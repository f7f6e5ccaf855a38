"""A bounded, seeded sample of training text: what a vocabulary or a tokenizer is fitted on, so
that converting takes the same memory whatever the corpus's size."""
from __future__ import annotations

import random

SAMPLE_SEED = 0  # the reservoir's: the same corpus always gives the same vocabulary


class TextSample:
    """The texts a vocabulary is adapted over, within `max_bytes`: every text while they fit,
    then a seeded reservoir sample (each text seen is kept with the same probability) of as
    many texts as had fitted."""

    def __init__(self, max_bytes: int, seed: int = SAMPLE_SEED):
        self.max_bytes, self.seed = max_bytes, seed
        self.texts: list[str] = []
        self.seen = self.bytes = 0
        self._capacity = None  # fixed when the texts stop fitting
        self._random = random.Random(seed)

    def add(self, text: str) -> None:
        """Offers one text to the sample."""
        self.seen += 1
        if self._capacity is None:
            self.texts.append(text)
            self.bytes += len(text)
            if self.bytes > self.max_bytes:
                self._capacity = len(self.texts)
            return
        slot = self._random.randrange(self.seen)
        if slot < self._capacity:
            self.texts[slot] = text

    def describe(self) -> dict:
        """What the vocabulary was adapted over, for the manifest."""
        return {"texts": len(self.texts), "of_texts": self.seen, "max_mb": self.max_bytes >> 20,
                "seed": self.seed, "sampled": self._capacity is not None}

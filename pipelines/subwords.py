"""Subword tokens: a SentencePiece model trained at conversion, the ecosystem's subword tokenizer.

`train` fits a unigram model (the `sentencepiece` package) on a sample of training text that
the pipeline bounds (`TextSample`: a seeded reservoir of at most `sample_mb` MB), so converting
takes the same time and memory for the model whatever the corpus's size. The model is
lossless: no normalization, no dummy prefix, whitespace kept, and characters outside its pieces
fall back to their UTF-8 bytes (`byte_fallback`), so `decode(encode(text)) == text` for any
text and no id is out of vocabulary. Ids 0, 1 and 2 are padding, unknown (never produced with
byte fallback) and end of document; the pieces follow.

The model file is stored beside the shards as the dataset's asset `tokenizer.model` (named and
hashed in dataset.json); the records hold the ids, so reading costs no tokenization. The export
tokenizes raw text with tensorflow-text's `SentencepieceTokenizer` over the same model file,
which gives exactly these ids (tests/test_subwords.py).
"""
from __future__ import annotations

import io

from tftrain.data.manifest import TOKENIZER_MODEL
from tftrain.errors import ConfigError

NAME = "sentencepiece"
PAD_ID, UNKNOWN_ID, END_ID = 0, 1, 2
MIN_VOCAB_SIZE = 3 + 256 + 1  # the special ids, the 256 byte pieces, and one piece of text
MAX_SENTENCE_BYTES = 1 << 16  # longer lines are cut into pieces this long for training


def train(texts: list[str], vocab_size: int) -> bytes:
    """A serialized SentencePiece model of at most `vocab_size` ids (fewer when the text has
    fewer pieces to give) fitted on `texts`, a bounded sample; the same texts give the same
    model. ConfigError when it cannot be trained."""
    import sentencepiece

    if vocab_size < MIN_VOCAB_SIZE:
        raise ConfigError(f"vocab_size={vocab_size} is too small for tokenizer={NAME}: it needs at "
                          f"least {MIN_VOCAB_SIZE} (3 special ids, 256 byte pieces, text pieces).")
    model = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=_sentences(texts), model_writer=model, vocab_size=vocab_size,
            model_type="unigram", byte_fallback=True, character_coverage=1.0,
            normalization_rule_name="identity", add_dummy_prefix=False,
            remove_extra_whitespaces=False, split_digits=True, allow_whitespace_only_pieces=True,
            max_sentence_length=MAX_SENTENCE_BYTES, pad_id=PAD_ID, unk_id=UNKNOWN_ID,
            eos_id=END_ID, bos_id=-1, num_threads=1, shuffle_input_sentence=False,
            hard_vocab_limit=False, minloglevel=2)
    except RuntimeError as e:  # e.g. "Vocabulary size is too high (N). Please set it to a value <= M."
        raise ConfigError(f"tokenizer={NAME} could not be trained: {str(e).strip()}; lower "
                          "vocab_size or give more training text.") from None
    return model.getvalue()


def _sentences(texts):
    """The training sentences: the texts (passages of lines: pieces may span a newline), long
    ones cut into parts SentencePiece does not skip (it skips sentences over its maximum)."""
    step = MAX_SENTENCE_BYTES // 4  # at most 4 UTF-8 bytes per character
    for text in texts:
        for start in range(0, len(text), step):
            if text[start:start + step].strip():
                yield text[start:start + step]


def graph_tokenizer(model: bytes):
    """tensorflow-text's `SentencepieceTokenizer` over `model`: int32 ids, as `Subwords.encode`."""
    import tensorflow as tf
    import tensorflow_text

    return tensorflow_text.SentencepieceTokenizer(model=model, out_type=tf.int32)


class Subwords:
    """A trained model: `encode` text to ids, `decode` ids to text, `token_bytes` per id."""

    def __init__(self, model: bytes):
        import sentencepiece

        self.model = model
        self.processor = sentencepiece.SentencePieceProcessor(model_proto=model)

    def __getstate__(self):  # the processor does not pickle; a worker process rebuilds it
        return {"model": self.model}

    def __setstate__(self, state):
        self.__init__(state["model"])

    @classmethod
    def of(cls, assets: dict) -> Subwords:
        """The model among a pipeline's `assets`; ConfigError when it has none."""
        if TOKENIZER_MODEL not in assets:
            raise ConfigError(f"this dataset was converted with tokenizer={NAME} but its "
                              f"{TOKENIZER_MODEL} was not loaded")
        return cls(assets[TOKENIZER_MODEL])

    @property
    def vocab_size(self) -> int:
        return self.processor.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self.processor.encode(text)

    def decode(self, ids) -> str:
        """The text of `ids`; padding and end-of-document ids are left out."""
        return self.processor.decode([int(i) for i in ids if int(i) > END_ID])

    def token_bytes(self) -> list[float]:
        """The UTF-8 bytes each id stands for (`info["token_bytes"]`): 0 for the special ids,
        1 for a byte piece, the piece's text for the others."""
        sizes = []
        for i in range(self.vocab_size):
            if self.processor.is_control(i) or self.processor.is_unknown(i):
                sizes.append(0.0)
            elif self.processor.is_byte(i):
                sizes.append(1.0)
            else:
                sizes.append(float(len(self.processor.id_to_piece(i).replace("\u2581", " ")
                                       .encode("utf-8"))))
        return sizes

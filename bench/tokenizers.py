"""Characters against subwords: the same language model at equal training steps on the embedded
Python documentation, compared by bits per byte (perplexity per token cannot compare them).

    .venv/bin/python bench/tokenizers.py [--steps=120] [--vocab_sizes=1024,4096] [--workdir=DIR]

Trains `--config=text_lm` (characters) and `--config=text_lm_subword` with each SentencePiece
`vocab_size` asked, with the command a user types (`tftrain train`, which converts the embedded
text on first use), all for the same `train.steps` of 64 windows of 64 tokens with the same
`transformer_lm`. Per tokenizer: the test split's bits per byte under a unigram model of the training tokens
(what the tokenizer alone gives) and after training (`summary.json`'s eval: its
negative log-likelihood in bits over the UTF-8 bytes the predicted tokens stand for), its
perplexity per token, tokens per byte of the text (the dataset's windows over the embedded
text's UTF-8 bytes), and training speed (steps/s, and KB/s of source text: a subword step
reads more text, so equal steps are not equal text). One run each, side by side on one machine: compare the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.table import markdown_table  # noqa: E402
from pipelines.text import embedded_text  # noqa: E402
from tftrain.host import cpu_name  # noqa: E402

TFTRAIN = os.path.join(os.path.dirname(sys.executable), "tftrain")


def train(work: str, name: str, config: str, steps: int, options: str) -> dict:
    """`tftrain train --config=CONFIG` for `steps` steps in `work/name`; its summary and the
    manifest of the dataset it converted."""
    data, run = os.path.join(work, name, "data"), os.path.join(work, name, "run")
    overrides = f"data.dir={data},data.pipeline=text,train.steps={steps},train.epochs=1"
    if options:
        overrides += f",data.pipeline_options={{{options}}}"
    done = subprocess.run([TFTRAIN, "train", f"--config={config}", f"--model_dir={run}",
                           "--overwrite", f"--params_override={overrides}"],
                          capture_output=True, text=True, cwd=work)
    if done.returncode:
        sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
    with open(os.path.join(run, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(data, "dataset.json")) as f:
        return {"summary": summary, "manifest": json.load(f), "data_dir": data}


def unigram_bits_per_byte(data_dir: str, info: dict) -> float:
    """The test split's bits per byte under the training split's token frequencies (add-one
    smoothed): what the tokenizer alone achieves, before any model."""
    import numpy as np

    from tftrain.data import load

    def targets(split):
        return np.concatenate([y.numpy().reshape(-1) for _, y in load(data_dir, split, 512,
                                                                        training=False)])

    counts = np.bincount(targets("train"), minlength=info["vocab_size"]) + 1.0
    test = targets("test")
    bits = -np.log2(counts[test] / counts.sum()).sum()
    return float(bits / np.asarray(info["token_bytes"])[test].sum())


def row(name: str, result: dict, text_bytes: int) -> list:
    """One table row of a trained tokenizer."""
    summary, manifest = result["summary"], result["manifest"]
    test, info = summary["eval"], manifest["info"]
    windows = sum(split["num_examples"] for split in manifest["splits"].values())
    tokens_per_byte = windows * (info["sequence_length"] + 1) / text_bytes
    steps_per_s = 1.0 / summary["seconds_per_step"]
    tokens_per_step = summary["examples_per_second"] * summary["seconds_per_step"] * (
        info["sequence_length"])
    unigram = unigram_bits_per_byte(result["data_dir"], info)
    return [name, f"{info['vocab_size']:,}", f"{unigram:.3f}", f"{test['bits_per_byte']:.3f}",
            f"{test['perplexity']:.2f}", f"{tokens_per_byte:.3f}", f"{steps_per_s:.2f}",
            f"{steps_per_s * tokens_per_step / tokens_per_byte / 1000:,.1f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)  # configs/text_lm.yaml: 4 x 30
    parser.add_argument("--vocab_sizes", default="1024,4096")
    parser.add_argument("--workdir", default="")
    args = parser.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="tftrain-bench-tokenizers-")
    os.makedirs(work, exist_ok=True)
    text_bytes = len(embedded_text().encode("utf-8"))
    print(f"CPU: {cpu_name()}; {args.steps} steps of 64 windows; embedded text "
          f"{text_bytes:,} bytes; work in {work}", flush=True)
    runs = [("characters", "text_lm", "sequence_length: 64")]
    runs += [(f"sentencepiece {size}", "text_lm_subword",
              f"sequence_length: 64, tokenizer: sentencepiece, vocab_size: {size}")
             for size in map(int, args.vocab_sizes.split(","))]
    rows = []
    for name, config, options in runs:
        print(f"  {name} ...", flush=True)
        rows.append(row(name, train(work, name.replace(" ", "-"), config, args.steps, options),
                        text_bytes))
    print(markdown_table(["tokenizer", "ids", "unigram bits/byte", "test bits/byte",
                          "perplexity/token",
                          "tokens/byte", "steps/s", "text KB/s"], rows))


if __name__ == "__main__":
    main()

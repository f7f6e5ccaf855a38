"""Global-norm clipping against a learning rate too high to train without it.

    .venv/bin/python bench/clipping.py [--runs=adam:0.03,sgd:1,sgd:3] [--seeds=42]

`text_lm` (the embedded Python documentation, characters, a 2-block transformer_lm, warmup and
cosine decay, 120 steps) trains with each optimizer and learning rate of `--runs` (`sgd` with
momentum 0.9) twice per seed, in its own process each: with `train.clip_global_norm=0` and with 1.0 (text_lm's default), everything
else the same. Per run: the loss of the first and last progress lines (every 10 steps), the
largest gradient norm seen, the share of updates clipped, the test perplexity against a
unigram model of the training tokens (add-one), and whether the run diverged (a NaN loss stops
it: `train.on_nan=stop`) or ended above its starting loss. Prints the CPU and the table.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.big_data import TFTRAIN  # noqa: E402
from bench.table import markdown_table  # noqa: E402
from tftrain.host import cpu_name  # noqa: E402

PROGRESS = re.compile(r"step (\d+)/\d+ loss=(\S+) grad_norm=(\S+) ")


def train(directory: str, data_dir: str, optimizer: str, learning_rate: float, clip: float,
          seed: int) -> dict:
    """One text_lm run; its progress, summary (None when it stopped) and exit code."""
    run = os.path.join(directory, f"{optimizer}_lr{learning_rate}_clip{clip}_seed{seed}")
    overrides = (f"data.dir={data_dir},train.optimizer={optimizer},train.momentum=0.9,"
                 f"train.learning_rate={learning_rate},"
                 f"train.clip_global_norm={clip},train.seed={seed},train.log_every_steps=10")
    done = subprocess.run([TFTRAIN, "train", "--config=text_lm", f"--model_dir={run}",
                           f"--params_override={overrides}"], capture_output=True, text=True,
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2"))
    progress = [(int(s), float(loss), float(norm))
                for s, loss, norm in PROGRESS.findall(done.stderr)]
    summary_path = os.path.join(run, "summary.json")
    summary = None
    if done.returncode == 0:
        with open(summary_path, encoding="utf-8") as f:
            summary = json.load(f)
    elif "training diverged" not in done.stderr:
        sys.exit(f"{optimizer} lr {learning_rate} clip {clip}: failed\n{done.stderr[-3000:]}")
    return {"progress": progress, "summary": summary, "code": done.returncode,
            "stderr": done.stderr}


def row(setting: list, result: dict, unigram: float) -> list:
    """The table row of one run (`setting`: optimizer, learning rate, clip, seed)."""
    progress, summary = result["progress"], result["summary"]
    first, last = progress[0][1], progress[-1][1]
    largest = max(norm for _, _, norm in progress)
    if summary is None:
        line = next(x for x in result["stderr"].splitlines() if "training diverged" in x)
        where = re.search(r"global step (\d+)", line)
        return [*setting, f"{first:.3f}", "NaN", f"{largest:.3g}", "", "",
                f"diverged (NaN at step {where.group(1) if where else '?'})"]
    gradients = summary["gradients"]
    perplexity = summary["eval"]["perplexity"]
    outcome = ("diverged (loss ended above its start)" if last > first else
               "trains" + (", below unigram" if perplexity < unigram else ", above unigram"))
    return [*setting, f"{first:.3f}", f"{last:.3f}",
            f"{max(largest, gradients['max_norm']):.3g}",
            f"{100 * gradients['clipped_fraction']:.0f}%", f"{perplexity:.2f}", outcome]


def main() -> None:
    from tests.test_language_model import unigram_perplexity

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="adam:0.03,sgd:1,sgd:3")
    parser.add_argument("--seeds", default="42")
    options = parser.parse_args()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        data_dir = os.path.join(directory, "text_lm")
        subprocess.run([TFTRAIN, "convert", "--pipeline=text", f"--output={data_dir}",
                        "--pipeline_options=sequence_length=64"], check=True,
                       capture_output=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
        unigram = unigram_perplexity(pathlib.Path(data_dir))
        for name, rate in (x.split(":") for x in options.runs.split(",")):
            for seed in (int(x) for x in options.seeds.split(",")):
                for clip in (0.0, 1.0):
                    result = train(directory, data_dir, name, float(rate), clip, seed)
                    setting = [name, rate, f"{clip:g}", str(seed)]
                    rows.append(row(setting, result, unigram))
                    print(" | ".join(rows[-1]), flush=True)
    print(f"\ntext_lm (2-block transformer_lm, warmup 20 then cosine, 120 steps of 64 windows; "
          f"sgd with momentum 0.9); unigram test perplexity {unigram:.2f}\n")
    print(markdown_table(["optimizer", "learning rate", "clip_global_norm", "seed", "first loss",
                          "last loss", "largest norm", "clipped", "test perplexity",
                          "outcome"], rows))


if __name__ == "__main__":
    main()

"""Flags shared by several commands, defined once and declared as key flags of each user.

A command module calls `use_flags(__name__, "model_dir", ...)`; the flag is defined the first
time and listed in that command's `--help`.
"""
from __future__ import annotations

import re

from absl import flags

from tftrain.config_schema import STRATEGIES

FLAGS = flags.FLAGS

_DEFINITIONS = {
    "output": lambda: flags.DEFINE_string(
        "output", None, "Where the command writes its result: convert, the dataset directory; "
        "evaluate, the metrics JSON; predict, the predictions (.csv or .jsonl). gs:// works."),
    "input": lambda: flags.DEFINE_string(
        "input", "", "Raw input: convert, a directory, file or TFDS name, as the pipeline "
        "expects; predict, an image, a folder (recursive), a glob, a CSV, JSON Lines or text "
        "file, or - (lines on standard input)."),
    "model": lambda: flags.DEFINE_string(
        "model", None, "SavedModel directory (e.g. RUN/export) or a .tflite file; predict: "
        "also a run directory (its export)."),
    "batch_size": lambda: flags.DEFINE_integer(
        "batch_size", None, "Examples per batch. evaluate: default the run's data.batch_size "
        "for a run's model, else 256; predict: default 256."),
    "max_bad_fraction": lambda: flags.DEFINE_float(
        "max_bad_fraction", 0.01, "Fail when more than this fraction of the rows are bad: "
        "convert leaves no dataset; predict keeps its output, whose error column says why."),
    "top_k": lambda: flags.DEFINE_integer(
        "top_k", None, "generate: sample among the K most likely tokens only (default 0: all); "
        "predict: the K most probable classes of each row (default 1).", lower_bound=0),
    "config": lambda: flags.DEFINE_string(
        "config", "digits", "Experiment config: a YAML path, the name of a shipped config "
        "(configs/NAME.yaml), or a run directory (the config it trained with: its params.yaml)."),
    "params_override": lambda: flags.DEFINE_string(
        "params_override", "", "Comma-separated config overrides applied last, e.g. "
        "'train.epochs=3,data.batch_size=64'."),
    "model_dir": lambda: flags.DEFINE_string(
        "model_dir", None, "Run directory (params.yaml, checkpoints/, backup/, logs/, export/, "
        "summary.json). gs:// works."),
    "strategy": lambda: flags.DEFINE_enum(
        "strategy", None,
        list(STRATEGIES), "Distribution strategy (runtime.strategy); pipeline: the model's "
        "layers in stages across devices (runtime.pipeline_stages, runtime.microbatches)."),
    "tpu": lambda: flags.DEFINE_string(
        "tpu", None, "TPU to use with --strategy=tpu: local, a TPU name or grpc://host:port "
        "(runtime.tpu)."),
    "mesh": lambda: flags.DEFINE_string(
        "mesh", None, "Device mesh for --strategy=dtensor, e.g. batch:2,model:2: batch splits the "
        "data, model splits the weights (runtime.mesh)."),
    "data": lambda: flags.DEFINE_string(
        "data", None, "Dataset directory (with dataset.json)."),
    "seed": lambda: flags.DEFINE_integer(
        "seed", 0, "Seed: convert, of spreading examples over shards; generate, of the "
        "sampling (the same seed writes the same text)."),
    "split": lambda: flags.DEFINE_string(
        "split", None, "Dataset split to measure; default: a run's test split (its "
        "data.test_split), or test for a dataset given by --data."),
    "pipeline": lambda: flags.DEFINE_string(
        "pipeline", None, "Dataset kind: digits, diabetes, image_folder, csv, numpy, tfds, jsonl, "
        "lmdb, text, or an importable module of your own (my_pkg.my_data)."),
    "pipeline_options": lambda: flags.DEFINE_string(
        "pipeline_options", "", "Pipeline options as key=value,key=value (a value may contain "
        "commas: columns=a,b,label_column=y)."),
    "max_metric_change": lambda: flags.DEFINE_float(
        "max_metric_change", None, "Regression and language-model runs: largest accepted "
        "relative RMSE / perplexity increase versus the float model (0.05 = 5% worse); default: 0.05 for quantize, no gate for "
        "prune.", lower_bound=0.0),
    "allow_python_in_model": lambda: flags.DEFINE_bool(
        "allow_python_in_model", False, "Load a model even if it carries Python code (a Lambda "
        "layer), which then runs in this process: only for models you trust."),
    "overwrite": lambda: flags.DEFINE_bool(
        "overwrite", False, "Replace existing finished output instead of refusing."),
    "json": lambda: flags.DEFINE_string(
        "json", None, "Also write the report as JSON to this path (local or gs://): doctor its "
        "numbers, check its findings and memory plan."),
    "steps": lambda: flags.DEFINE_integer(
        "steps", None, "Batches to run. doctor: timed steps per measurement (each also has a "
        "warm-up; default 100). evaluate, prune, quantize: measure each model on at most this "
        "many batches of the split, the same batches for every model compared (default, or 0: "
        "the whole split); the output states the examples measured.", lower_bound=0),
}


def use_flags(module_name: str, *names: str) -> None:
    """Defines the shared flags `names` (once) and makes them key flags of `module_name`."""
    for name in names:
        if name not in FLAGS:
            _DEFINITIONS[name]()
        FLAGS.register_key_flag_for_module(module_name, FLAGS[name])


def require(*names: str) -> None:
    """Raises ConfigError unless every flag in `names` was given a value."""
    from tftrain.errors import ConfigError

    missing = [f"--{name}" for name in names if FLAGS[name].value in (None, "")]
    if missing:
        raise ConfigError(f"missing required flag(s): {', '.join(missing)}")


_OPTION_START = re.compile(r",\s*(?=[A-Za-z_][\w.-]*\s*=)")


def parse_pipeline_options(text: str) -> dict[str, str]:
    """Parses 'a=1,b=x,y' into {'a': '1', 'b': 'x,y'}: a comma starts an option only before `key=`."""
    from tftrain.errors import ConfigError

    options: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in _OPTION_START.split(text or ""))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"bad pipeline option {part!r} in --pipeline_options={text!r}: write "
                              "key=value,key=value.")
        if key in options:
            raise ConfigError(f"pipeline option {key!r} is given twice in --pipeline_options={text!r}.")
        options[key] = value.strip()
    return options

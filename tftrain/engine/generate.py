"""Text from a trained language model: the run's export, decoded one token at a time.

`generate(model_dir, prompt, ...)` reads the run's `params.yaml` (it must have trained
`task.type=language_model`), the vocabulary of its dataset (the manifest's `info`, written by the
`text` pipeline at conversion) with its tokenizer (characters, or the SentencePiece model kept
beside the shards), and its export (`export.saved_model_dir`: the highest version, what TF
Serving would serve). The prompt becomes token ids; at each step the
model reads the last `sequence_length` tokens (left-aligned, padded with id 0 after them: the
model is causal, so padding never reaches the position read) and the next token is the most
likely one (`temperature=0`, greedy) or drawn from the softmax of logits / temperature, among
the `top_k` most likely when `top_k > 0`. Padding and out-of-vocabulary ids are never drawn;
an end-of-document id ends the text early.
"""
from __future__ import annotations

import numpy as np

from tftrain.errors import ConfigError, TftrainError
from tftrain.fileio import join


def load_run(model_dir: str) -> tuple[dict, dict, str, object]:
    """`(params, info, export path, tokenizer)` of a language-model run; a TftrainError naming
    what is missing otherwise (no run, not a language model, no dataset, no export)."""
    import tensorflow as tf

    from tftrain import config as config_lib
    from tftrain import run_dir
    from tftrain.data import manifest as manifest_lib
    from tftrain.engine import export

    params_path = join(model_dir, run_dir.PARAMS)
    if not tf.io.gfile.exists(params_path):
        raise TftrainError(f"--model_dir={model_dir} is not a tftrain run (no {run_dir.PARAMS}): "
                           "pass the --model_dir of a finished `tftrain train` of a language "
                           "model (e.g. --config=text_lm)")
    params = config_lib.read_yaml(params_path)
    task_type = (params.get("task") or {}).get("type", "classification")
    if task_type != "language_model":
        raise TftrainError(f"the run {model_dir} trained a {task_type} model, not a language "
                           "model: generate needs a run of task.type=language_model (e.g. "
                           "tftrain train --config=text_lm)")
    data_dir = (params.get("data") or {}).get("dir", "")
    if not manifest_lib.exists(data_dir):
        raise TftrainError(f"the dataset of run {model_dir} (data.dir={data_dir}) is not there: "
                           "generate reads its vocabulary; run from the directory the run was "
                           "trained in, or convert the same text there again")
    from pipelines.text import tokenizer_of

    manifest = manifest_lib.read(data_dir)
    info = manifest.get("info") or {}
    if not (info.get("vocabulary") or info.get("tokenizer_model")) or \
            not info.get("sequence_length"):
        raise TftrainError(f"the dataset {data_dir} has no tokenizer and sequence_length in "
                           "its info: generate needs a dataset of the text pipeline")
    tokenizer = tokenizer_of(info, manifest_lib.read_assets(data_dir, manifest))
    found = export.saved_model_dir(join(model_dir, run_dir.EXPORT))
    if found is None:
        raise TftrainError(f"the run {model_dir} has no export (no SavedModel in "
                           f"{join(model_dir, run_dir.EXPORT)}): let its training finish first")
    return params, info, found, tokenizer


def next_token(logits: np.ndarray, temperature: float, top_k: int, rng) -> int:
    """The next token id from one position's logits (padding and out-of-vocabulary excluded)."""
    from pipelines.text import OOV_ID, PAD_ID

    logits = np.asarray(logits, np.float64).copy()
    logits[[PAD_ID, OOV_ID]] = -np.inf
    if temperature <= 0:
        return int(np.argmax(logits))
    if 0 < top_k < len(logits):
        logits[logits < np.sort(logits)[-top_k]] = -np.inf
    scaled = (logits - logits.max()) / temperature
    probabilities = np.exp(scaled)
    return int(rng.choice(len(logits), p=probabilities / probabilities.sum()))


def generate(model_dir: str, prompt: str, max_tokens: int = 200, temperature: float = 0.8,
             top_k: int = 0, seed: int = 0) -> str:
    """The prompt and `max_tokens` tokens the run's exported model writes after it (see the
    module docstring); the same seed gives the same text."""
    if not prompt:
        raise ConfigError("--prompt is empty: give the text to continue, e.g. --prompt='The '")
    if max_tokens < 0 or temperature < 0 or top_k < 0:
        raise ConfigError("--max_tokens, --temperature and --top_k must not be negative")
    import tensorflow as tf

    _, info, path, tokenizer = load_run(model_dir)
    length = int(info["sequence_length"])
    from tftrain.engine import export

    export.register_text_ops()
    serve = tf.saved_model.load(path).signatures["serving_default"]
    (input_name,) = serve.structured_input_signature[1]
    ids = tokenizer.encode(prompt)
    prompt_ids = len(ids)
    rng = np.random.default_rng(seed)
    for _ in range(max_tokens):
        context = ids[-length:]
        window = np.zeros((1, length), np.int32)
        window[0, :len(context)] = context
        (logits,) = serve(**{input_name: tf.constant(window)}).values()
        ids.append(next_token(logits.numpy()[0, len(context) - 1], temperature, top_k, rng))
        if ids[-1] == info.get("end_id"):  # the model ended the document
            break
    return prompt + tokenizer.decode(ids[prompt_ids:])

"""The trained model as TF Serving loads it: `export/<version>/`, a SavedModel for tensors and
for serialized `tf.train.Example`s.

    export/                  a TF Serving base path (`--model_base_path=RUN/export`)
      .tftrain.json          tftrain's marker (written first)
      <version>/             the SavedModel: saved_model.pb, variables/, keras_metadata.pb

The version is the time of the export in seconds since the epoch (as Estimator's and Model
Garden's exporters name theirs), and always above any version already there: TF Serving serves
the highest version of a base path, so a later export of the run (a resumed run exporting again)
takes over from the one before, which is removed once the new one is in place. Each version is
written under `<version>.tmp` (not a number, so TF Serving skips it) and renamed when complete.
A SavedModel directly in export/ (the layout of earlier tftrain versions) is still found by
`saved_model_dir`.

Signatures (TF Serving's Predict API takes any of them, its Classify API the `classify` one):
- `serving_default`: Keras's own: the model's input tensors -> `logits`; what
  `tf_keras.models.load_model` and tensor clients use.
- `serving_examples`: `examples`, a string [None] of serialized `tf.train.Example`s with the
  dataset's features -> `logits`, `probabilities`, `class_ids` (int64) and `classes` (class names).
- `serving_text`, for a pipeline that tokenizes raw text (`pipeline.text_inputs`: jsonl, and
  text's language models): `text`, a string [None] of raw texts -> the outputs of
  `serving_examples` (a language model's `token_ids` too: the ids its logits are of); the
  tokenizer (its vocabulary from the dataset's manifest, or tensorflow-text's
  `SentencepieceTokenizer` over the dataset's `tokenizer.model`) is part of the SavedModel.
- `classify`: `inputs` (serialized Examples) -> `classes` (string [None, K], the class names)
  and `scores` (float32 [None, K]): the names TF Serving's Classify API reads. TF2 SavedModels
  write every signature with the predict method name, which TF Serving accepts unless it runs
  with `--enable_signature_method_name_check`.

The Examples are parsed with the dataset's own schema and decoded by its pipeline's `decode`,
exactly as training reads them, except that the features the model's inputs do not read (the
label, file names, ...) are optional: a request has no label.
"""
from __future__ import annotations

import contextlib
import functools
import posixpath
import re
import time

import tensorflow as tf
import tf_keras as keras
from absl import logging

from pipelines import dataset_pipeline
from tftrain.callbacks import preemption
from tftrain import ownership, run_dir
from tftrain.data import foreign, reader
from tftrain.fileio import join, remove
from tftrain.models import attention

SAVED_MODEL = "saved_model.pb"
EXAMPLES_SIGNATURE = "serving_examples"
TEXT_SIGNATURE = "serving_text"
CLASSIFY_SIGNATURE = "classify"
# What a SavedModel written straight into export/ (earlier tftrain versions) holds there.
_SAVED_MODEL_ENTRIES = {SAVED_MODEL, "saved_model.pbtxt", "keras_metadata.pb", "fingerprint.pb",
                        "variables", "assets"}
_VERSION_ENTRY = re.compile(r"(\d+)(\.tmp)?")


def export(model, export_dir: str, data=None, manifest: dict | None = None) -> str:
    """Exports `model` for serving into `export_dir/<version>/`; returns that directory.

    `data` (the run's `DataConfig`) and `manifest` (its dataset's manifest) say how the
    dataset's Examples are parsed and decoded, for the Example signatures (see the module
    docstring). Without them, `model` is saved as a plain SavedModel at `export_dir` itself
    (what `tftrain prune` writes into pruned/). `export_dir` is written into only when tftrain
    wrote it (`run_dir.replaceable`). A pipeline whose decode cannot be exported leaves a
    warning and an export with `serving_default` only.
    """
    if data is None:
        save_saved_model(model, export_dir)
        return export_dir
    run_dir.check_replaceable(export_dir)
    run_dir.mark_output(export_dir)
    version = str(max([int(time.time()), *(v + 1 for v in versions(export_dir))]))
    path = join(export_dir, version)
    infer = inference_function(model)
    default = {"serving_default": tensor_signature(model, infer)}
    try:
        signatures, resources = example_signatures(infer, data, manifest)
        with _tracking(model, resources):
            save_saved_model(model, path, {**default, **signatures})
    except preemption.Preempted:
        raise
    except Exception as e:  # a user's decode may not trace or serialize: keep the tensor export
        logging.warning("%s gets the tensor signature serving_default only: the %s and %s "
                        "signatures failed for pipeline %r (%s: %s)", path, EXAMPLES_SIGNATURE,
                        CLASSIFY_SIGNATURE, manifest.get("pipeline"), type(e).__name__,
                        (str(e).splitlines() or [""])[0])
        save_saved_model(model, path, default)
    for name in ownership.listing(export_dir) - {version, ownership.MARKER}:
        older = _VERSION_ENTRY.fullmatch(name) and ownership.replaceable(join(export_dir, name))
        if older or name in _SAVED_MODEL_ENTRIES:  # an earlier export, or an earlier layout's
            remove(join(export_dir, name), within=export_dir)
    logging.info("exported SavedModel to %s", path)
    return path


def register_text_ops() -> None:
    """Registers tensorflow-text's ops in this process; call it before loading an export: one
    whose raw-text signature tokenizes with SentencePiece holds them (TensorFlow does not)."""
    import tensorflow_text  # noqa: F401  (importing registers the ops)


def save_saved_model(model, path: str, signatures: dict | None = None) -> None:
    """Saves `model` as a SavedModel at `path` under a temporary name, then moves it into place.

    The SavedModel carries tftrain's marker, and an existing `path` (or the temporary directory
    of a killed save) is replaced only when tftrain wrote it (`run_dir.replaceable`).
    """
    run_dir.check_replaceable(path)
    save = functools.partial(model.save, save_format="tf", include_optimizer=False,
                             signatures=signatures, save_traces=needs_traces(model))
    if path.startswith("ram://"):
        # TensorFlow's in-memory filesystem loses a directory's files when it is renamed.
        remove(path, within=posixpath.dirname(path))
        run_dir.mark_output(path)
        save(path)
        return
    tmp = path + ".tmp"
    run_dir.check_replaceable(tmp)
    remove(tmp, within=posixpath.dirname(tmp))
    run_dir.mark_output(tmp)
    save(tmp)
    remove(path, within=posixpath.dirname(path))
    tf.io.gfile.rename(tmp, path)


def needs_traces(model) -> bool:
    """Whether the SavedModel must carry the traced call functions of the model's layers.

    `load_model` rebuilds a model of built-in tf-keras layers from its config alone, without
    traces, and so tftrain's attention layers, saved as the tf-keras classes they extend
    (`models.attention`); other layers (TFMOT's wrappers, a user's own) it can only revive from
    their traced functions when their classes are not importable. Tracing every layer is most
    of a save's time: 17 s of 20 for MobileNetV2 (configs/finetune.yaml).
    """
    rebuilt_from_config = tuple(attention.saved_classes().values())
    return any(not (type(layer).__module__.startswith("tf_keras.")
                    or type(layer) in rebuilt_from_config)
               for layer in model.submodules if isinstance(layer, keras.layers.Layer))


def load_keras_model(path: str, compile: bool = False):
    """tf-keras's `load_model` of the SavedModel (or file) at `path`. A SavedModel tftrain wrote
    (its marker) gets tftrain's layers back in place of the tf-keras classes they are saved as
    (`models.attention.saved_classes`); a model from elsewhere loads as tf-keras builds it (its
    `MultiHeadAttention` stays tf-keras's own, which TFMOT knows how to prune)."""
    ours = tf.io.gfile.exists(join(path, ownership.MARKER))
    return keras.models.load_model(path, compile=compile,
                                   custom_objects=attention.saved_classes() if ours else None)


def versions(export_dir: str) -> list[int]:
    """The version numbers of the SavedModels in `export_dir`, lowest first."""
    return sorted(int(name) for name in ownership.listing(export_dir)
                  if name.isdigit() and tf.io.gfile.exists(join(export_dir, name, SAVED_MODEL)))


def saved_model_dir(path: str) -> str | None:
    """The SavedModel that `path` stands for, or None: `path` itself when it holds
    saved_model.pb (a version directory, pruned/, or an export/ of an earlier tftrain), else
    its highest version, the one TF Serving serves."""
    if tf.io.gfile.exists(join(path, SAVED_MODEL)):
        return path
    found = versions(path) if tf.io.gfile.isdir(path) else []
    return join(path, str(found[-1])) if found else None


def inference_function(model):
    """The model's inference outputs by output name (`_named_outputs`) as one `tf.function`,
    which every signature calls: traced once for the tensors of Keras's save spec, it is called
    from the Example and text signatures without tracing the model again when their decoded
    inputs match that spec (a transformer_lm's export traced its model three times)."""
    return tf.function(functools.partial(_named_outputs, model), autograph=False)


def tensor_signature(model, infer=None):
    """Keras's `serving_default`: the model's input tensors -> its outputs by output name
    (`infer`: the model's `inference_function`)."""
    args, kwargs = model.save_spec(dynamic_batch=True)
    return (infer or inference_function(model)).get_concrete_function(*args, **kwargs)


def example_signatures(infer, data, manifest: dict) -> tuple[dict, list]:
    """`serving_examples`, `serving_text` for a pipeline with `text_inputs`, and, for a
    classifier (one [batch, K] output, a dataset with `num_classes`), `classify` (see the
    module docstring), traced, calling `infer` (the model's `inference_function`); and the
    pipeline's resources (lookup tables, tokenizer layers) they capture."""
    source = foreign.load_kwargs(data)  # the pipeline, options, info and schema of reader.load
    info = foreign.decode_info(data, manifest.get("info", {}))
    pipeline = dataset_pipeline(manifest["pipeline"], source.get("pipeline"),
                                source.get("trusted_pipeline"), **source.get("pipeline_options", {}))
    if manifest.get("assets"):  # a tokenizer model: the raw-text signature tokenizes with it
        pipeline.load_assets(data.dir, manifest)
    spec = example_spec(manifest.get("features") or pipeline.features(info), pipeline, info)

    def logits_and_names(serialized, texts=None):
        if texts is None:
            inputs, _ = pipeline.decode(tf.io.parse_example(serialized, spec), info)
        else:
            inputs = pipeline.text_inputs(texts, info)
        outputs = infer(inputs)
        logits = next(iter(outputs.values())) if len(outputs) == 1 else None
        if logits is None or logits.shape.rank != 2 or not info.get("num_classes"):
            if texts is not None:  # e.g. a language model: which position is a text's last
                outputs = {**outputs, "token_ids": inputs}
            return outputs, None  # not a classifier (e.g. a regression: no classes to name)
        names = info.get("class_names") or []
        if len(names) != logits.shape[-1]:
            names = [str(i) for i in range(logits.shape[-1])]
        return logits, tf.constant(names)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")],
                 autograph=False)
    def serve_examples(examples):
        return predictions(*logits_and_names(examples))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")],
                 autograph=False)
    def serve_text(text):
        return predictions(*logits_and_names(None, texts=text))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")],
                 autograph=False)
    def classify(inputs):
        logits, names = logits_and_names(inputs)
        return {"classes": tf.tile(names[None], [tf.shape(logits)[0], 1]),
                "scores": tf.nn.softmax(logits)}

    signatures = {EXAMPLES_SIGNATURE: serve_examples.get_concrete_function()}
    if callable(getattr(pipeline, "text_inputs", None)):
        signatures[TEXT_SIGNATURE] = serve_text.get_concrete_function()
    if "class_ids" in signatures[EXAMPLES_SIGNATURE].structured_outputs:
        signatures[CLASSIFY_SIGNATURE] = classify.get_concrete_function()
    return signatures, _resources(pipeline)


def predictions(logits, names):
    """A classifier's serving outputs for its `logits` and class `names` (None: not a
    classifier, whose outputs are returned as they are)."""
    if names is None:
        return logits
    class_ids = tf.argmax(logits, axis=-1)
    return {"logits": logits, "probabilities": tf.nn.softmax(logits), "class_ids": class_ids,
            "classes": tf.gather(names, class_ids)}


def _named_outputs(model, *args, **kwargs) -> dict:
    """The model's inference outputs as a flat dict by output name, as Keras's signature has."""
    outputs = tf.nest.flatten(model(*args, training=False, **kwargs))
    names = model.output_names or [f"output_{i}" for i in range(len(outputs))]
    return dict(zip(names, outputs))


def example_spec(features: dict, pipeline, info: dict) -> dict:
    """The `tf.io.parse_example` spec of a serving request: the dataset's (`reader.parse_spec`),
    with a default for every feature that the decoded inputs do not read (the label, ...)."""
    spec = reader.parse_spec(features)
    read = reader.features_reached(spec, pipeline, info, part="inputs")
    for name, feature in spec.items():
        if (name not in read and isinstance(feature, tf.io.FixedLenFeature)
                and feature.default_value is None):
            spec[name] = feature._replace(
                default_value=tf.zeros(feature.shape, feature.dtype).numpy())
    return spec


def _resources(obj, depth: int = 3) -> list:
    """The TensorFlow resources (lookup tables, variables, modules) held by `obj`'s attributes,
    a few levels deep: a pipeline's decode captures them, and a SavedModel must track them."""
    trackable = (tf.Module, tf.Variable, tf.saved_model.experimental.TrackableResource)
    if isinstance(obj, trackable):
        return [obj]
    if depth == 0:
        return []
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        children = list(obj)
    else:
        children = list(getattr(obj, "__dict__", {}).values())
    return [found for child in children for found in _resources(child, depth - 1)]


@contextlib.contextmanager
def _tracking(model, resources: list):
    """Attaches `resources` to `model` while it is saved, so that its SavedModel tracks them."""
    if not resources:
        yield
        return
    holder = tf.Module()
    holder.resources = list(resources)
    model._tftrain_serving_resources = holder
    try:
        yield
    finally:
        del model._tftrain_serving_resources

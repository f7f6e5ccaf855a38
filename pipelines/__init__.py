"""Dataset kinds: one module per kind, each defining a `Pipeline` class (see `pipelines.base`).

`load_pipeline("digits")` loads `pipelines.digits`; a dotted name such as `my_pkg.my_data`
loads a user's own module with the same contract, without touching tftrain. A dataset's
manifest names the pipeline that wrote it, but a dataset from elsewhere is data, not code: it
may choose only a built-in pipeline, or the one the user named (`dataset_pipeline`).
"""
import importlib

from tftrain.errors import ConfigError, DataError

from pipelines.base import BasePipeline, Row  # noqa: F401  (the public contract)

BUILTIN = ("digits", "diabetes", "image_folder", "csv", "numpy", "tfds", "jsonl", "lmdb", "text")
# Helper modules of the kinds that a user may take for a kind, and the kind they want.
HELPER_HINTS = {"images": "for image TFRecords (image/encoded, image/class/label) or a folder of "
                          "images, use image_folder"}


def load_pipeline(name: str, **options) -> BasePipeline:
    """Returns an instance of the `Pipeline` class of `pipelines.<name>` or of module `name`."""
    module_name = f"pipelines.{name}" if "." not in name else name
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise ConfigError(
                f"unknown pipeline {name!r}: no module {module_name!r}. Built-in pipelines: "
                f"{', '.join(BUILTIN)}; or pass an importable module such as my_pkg.my_data "
                "that defines `class Pipeline(pipelines.base.BasePipeline)`.") from None
        raise
    cls = getattr(module, "Pipeline", None)
    if not (isinstance(cls, type) and issubclass(cls, BasePipeline)) and "." not in name:
        hint = f"; {HELPER_HINTS[name]}" if name in HELPER_HINTS else ""
        raise ConfigError(
            f"pipeline {name!r} is not a dataset kind (pipelines/{name}.py is a helper module "
            f"of the kinds): the kinds are {', '.join(BUILTIN)}, or an importable module of "
            "your own (my_pkg.my_data) that defines `class Pipeline(pipelines.base."
            f"BasePipeline)`{hint}.")
    if not (isinstance(cls, type) and issubclass(cls, BasePipeline)):
        raise ConfigError(
            f"pipeline module {module_name!r} must define `class Pipeline(pipelines.base.BasePipeline)`.")
    pipeline = cls(**options)
    if "." in name:  # a user's module: the manifest must name what loads it again
        pipeline.name = name
    return pipeline


def dataset_pipeline(named_by_data: str, user_pipeline: str | None = None,
                     trusted: str | None = None, **options) -> BasePipeline:
    """The pipeline that reads a dataset whose manifest names `named_by_data`: `user_pipeline`
    when the user named one for this read (a flag), else `named_by_data` if it is built in or
    is `trusted` (the user's config names it, `data.pipeline`). Any other module a manifest
    names is refused, never imported."""
    if user_pipeline:
        return load_pipeline(user_pipeline, **options)
    if not isinstance(named_by_data, str) or (named_by_data not in BUILTIN
                                              and named_by_data != trusted):
        raise DataError(
            f"the dataset names the pipeline {named_by_data!r}, which is not built in, and "
            "tftrain does not import code that a dataset names. If you trust that module, say "
            f"so: set data.pipeline: {named_by_data} in the config (tftrain evaluate: "
            f"--pipeline={named_by_data}).")
    return load_pipeline(named_by_data, **options)

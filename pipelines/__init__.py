"""Dataset kinds: one module per kind, each defining a `Pipeline` class (see `pipelines.base`).

`load_pipeline("digits")` loads `pipelines.digits`; a dotted name such as `my_pkg.my_data`
loads a user's own module with the same contract, without touching tftrain.
"""
import importlib

from tftrain.errors import ConfigError

from pipelines.base import BasePipeline, Row  # noqa: F401  (the public contract)

BUILTIN = ("digits", "diabetes", "image_folder", "csv", "numpy", "tfds", "jsonl", "lmdb", "text")


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
    if not (isinstance(cls, type) and issubclass(cls, BasePipeline)):
        raise ConfigError(
            f"pipeline module {module_name!r} must define `class Pipeline(pipelines.base.BasePipeline)`.")
    pipeline = cls(**options)
    if "." in name:  # a user's module: the manifest must name what loads it again
        pipeline.name = name
    return pipeline

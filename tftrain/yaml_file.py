"""YAML files read safely and within bounds: a config, a run's params.yaml.

The safe loader only; at most MAX_YAML_BYTES of UTF-8 text from a regular file, and at most
MAX_YAML_NODES values counted through aliases (a few hundred bytes can expand to billions).
"""
from __future__ import annotations

import os
import stat

import yaml

from tftrain.errors import ConfigError

MAX_YAML_BYTES = 1 << 20  # a config, or a run's params.yaml: kilobytes
MAX_YAML_NODES = 100_000  # counted through aliases: a few hundred bytes can expand to billions


def read_yaml(path: str) -> dict:
    """Reads a YAML mapping safely and within bounds (`load_yaml`); errors name the file."""
    if path.startswith(("gs://", "ram://")):
        import tensorflow as tf

        with tf.io.gfile.GFile(path, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    else:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block, a device never end
            raise ConfigError(f"{path} is not a regular file, so it is not a config file.")
        with open(path, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    if len(raw) > MAX_YAML_BYTES:
        raise ConfigError(f"{path} is over {MAX_YAML_BYTES >> 20} MiB: not a config file.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text (byte {e.start}); save it as UTF-8.") from None
    data = load_yaml(text, path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (data, model, train, runtime).")
    return data


def load_yaml(text: str, where: str):
    """Parses YAML with the safe loader, refusing a document that expands (through aliases)
    to more than MAX_YAML_NODES nodes, refers to itself, or nests too deeply; errors are one
    ConfigError naming `where`."""
    loader = None
    try:
        loader = yaml.SafeLoader(text)
        node = loader.get_single_node()
        if node is not None:
            _expanded_size(node, {}, set(), where)
        return None if node is None else loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where} is not valid YAML: {e}".replace("\n", " ")) from None
    except RecursionError:
        raise ConfigError(f"{where} nests too deeply to be a config.") from None
    finally:
        if loader is not None:
            loader.dispose()


def _expanded_size(node, sizes: dict, open_nodes: set, where: str) -> int:
    """The number of nodes `node` stands for once every alias is expanded (memoized by node,
    so this costs the size of the document, not of its expansion)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:
        raise ConfigError(f"{where}: an alias refers to the node that contains it (a YAML "
                          "structure that never ends).")
    open_nodes.add(key)
    children = node.value if isinstance(node.value, list) else []
    size = 1
    for child in children:
        for item in (child if isinstance(child, tuple) else (child,)):
            size += _expanded_size(item, sizes, open_nodes, where)
            if size > MAX_YAML_NODES:
                raise ConfigError(
                    f"{where} expands to over {MAX_YAML_NODES:,} values through its aliases "
                    "(&anchor / *alias): that is not a config. Write the values out.")
    open_nodes.discard(key)
    sizes[key] = size
    return size

"""String -> id lookup tables for `decode`, built once per vocabulary and reused."""
from __future__ import annotations


def static_table(keys: list[str], first_id: int, default_id: int):
    """A `tf.lookup.StaticHashTable` mapping `keys[i]` to `first_id + i`, others to `default_id`.

    Built in the eager context (`tf.init_scope`), so it can be created while a `tf.data` map
    function is traced and then captured by it.
    """
    import tensorflow as tf

    keys = list(keys)
    values = list(range(first_id, first_id + len(keys)))
    if not keys:  # an empty vocabulary: every string maps to the default
        keys, values = [""], [default_id]
    with tf.init_scope():
        initializer = tf.lookup.KeyValueTensorInitializer(
            tf.constant(keys, tf.string), tf.constant(values, tf.int64))
        return tf.lookup.StaticHashTable(initializer, default_value=default_id)


class TableCache:
    """Keeps one table per name, so each batch's decode reuses the tables of the first."""

    def __init__(self):
        self._tables = {}

    def get(self, name: str, keys: list[str], first_id: int, default_id: int):
        """The table for `name`, built on first use."""
        if name not in self._tables:
            self._tables[name] = static_table(keys, first_id, default_id)
        return self._tables[name]

    def __getstate__(self):  # tables do not cross process boundaries; workers rebuild them
        return {"_tables": {}}

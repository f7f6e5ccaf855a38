"""Prune, quantize and evaluate trained tf-keras models, each measured against the float model.

Modules, one job each:
- `keras_model`: load a tf-keras model, reject Keras 3, clone it in float32 with its weights;
- `metrics`: classification accuracy of a Keras model on a dataset;
- `bounds`: `--steps`, a measurement on the first N batches of a split, its examples counted;
- `sizes`: file and gzip sizes;
- `finetune`: compile and fit a clone (pruning and quantization-aware training);
- `prune`: magnitude pruning (`prune_low_magnitude`) and per-layer sparsity reports;
- `quantize`: TFLite conversion (dynamic, int8, float16) and quantization-aware training;
- `tflite_eval`: run a .tflite with the LiteRT interpreter: accuracy and latency;
- `report`: report.json files and the float / pruned / int8 / float16 comparison table;
- `runs`: the `tftrain prune` / `tftrain quantize` flows over a run directory;
- `predict`: `tftrain predict`, a run's model on new raw files through its dataset's pipeline.

Everything works on a tf-keras model plus `tf.data` datasets of `(inputs, label)` batches.
"""

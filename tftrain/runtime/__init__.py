"""Where a run executes: tf.distribute strategies (`runtime.distribute`), clusters and their
resolvers, TPUs, the local multi-worker launcher, and DTensor mesh layouts. Nothing here
imports TensorFlow at module import time unless it needs it (`tftrain launch` must not)."""

"""Pipeline replicas across workers: each stage's sums reduced among the workers that hold it.

A pipeline run on W workers (`tftrain launch`, TF_CONFIG, SLURM or Kubernetes) is W copies of
the host's pipeline (S stages x R replicas on each), trained data-parallel. tf.distribute has
no strategy for it: one of its replicas is one device, and MultiWorkerMirroredStrategy reduces
every gradient among all replicas, while here a replica spans S devices of its host and stage
s's gradients must be summed only among the W devices that hold stage s. So each stage reduces
with `CollectiveReduceV2` in a group of its own (group key per stage, group size W) on the
collective runtime that MultiWorkerMirroredStrategy's constructor starts (the public way to
start it; the strategy's scope is never entered: the step is the pipeline's own).

Every worker builds the same step, so issues the same collectives with the same keys; a
collective's instance key names what it reduces (stage, purpose, dtype) and is the same at
every step. A ring all-reduce computes each element once and hands every worker that result,
so the workers' weights stay bit-for-bit equal.
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from tftrain.runtime import cluster, distribute

# Far above the keys tf.distribute's own collectives take (CollectiveKeys count up from 1).
GROUP_KEY_BASE = 1_000_000
INSTANCE_KEY_BASE = 1_000_000
PURPOSES = ("gradients", "statistics", "weights", "metrics")
MAX_DTYPES = 8  # dtypes one reduction may mix (float32, float16, bfloat16, float64 in practice)


@dataclasses.dataclass(frozen=True)
class Workers:
    """This worker's place among the `count` workers of a pipeline run (`index` 0 the chief),
    and the cross-worker sums of its stages' tensors."""

    count: int
    index: int

    @property
    def chief(self) -> bool:
        return self.index == 0

    def sum(self, tensors: list, stage: int, purpose: str) -> list:
        """`tensors` (on stage `stage`'s device of this worker: the caller's device scope) each
        summed over the workers. Tensors of one dtype travel as one flat tensor: one
        collective per dtype rather than per tensor (the latency of each, not the bytes,
        dominates a small stage's reduce over TCP)."""
        by_dtype: dict = {}
        for i, tensor in enumerate(tensors):
            by_dtype.setdefault(tensor.dtype, []).append(i)
        if len(by_dtype) > MAX_DTYPES:
            raise ValueError(f"{len(by_dtype)} dtypes in one reduction (at most {MAX_DTYPES})")
        summed = [None] * len(tensors)
        for slot, dtype in enumerate(sorted(by_dtype, key=lambda d: d.name)):
            chosen = [tensors[i] for i in by_dtype[dtype]]
            flat = tf.concat([tf.reshape(t, [-1]) for t in chosen], axis=0)
            reduced = tf.raw_ops.CollectiveReduceV2(
                input=flat, group_size=self.count, group_key=GROUP_KEY_BASE + stage,
                instance_key=self.instance_key(stage, purpose, slot), ordering_token=[],
                merge_op="Add", final_op="Id")
            parts = tf.split(reduced, [t.shape.num_elements() for t in chosen])
            for i, part, t in zip(by_dtype[dtype], parts, chosen):
                summed[i] = tf.reshape(part, t.shape)
        return summed

    def instance_key(self, stage: int, purpose: str, slot: int) -> int:
        """The collective instance of stage `stage`'s reduction for `purpose` of its `slot`-th
        dtype: the same on every worker and at every step."""
        return INSTANCE_KEY_BASE + (stage * len(PURPOSES) + PURPOSES.index(purpose)) * MAX_DTYPES \
            + slot


def start(runtime, member: cluster.Membership) -> Workers | None:
    """The workers of this run when its cluster has more than one (their collective runtime
    started); None on one machine. `member` is this process's place in the cluster
    (`cluster.use(runtime.cluster)`). Call after the stages' devices are configured."""
    if member.num_workers <= 1:
        return None
    distribute.multi_worker_mirrored(runtime)  # starts the collective runtime on every worker
    return Workers(member.num_workers, _worker_index(member))


def _worker_index(member) -> int:
    """The worker's rank: a `chief` task is 0, worker i is i (+1 when there is a chief)."""
    if member.task_type == "chief":
        return 0
    has_chief = bool(cluster.tf_config().get("cluster", {}).get("chief"))
    return member.task_index + (1 if has_chief else 0)

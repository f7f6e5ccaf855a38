"""Batch: the global batch over the replicas, steps per host call, and the partial last batch.

`data.batch_size` is the global batch: it must divide by the replica count (every TPU core or
chip, GPU or worker gets the same share). On TPU, per-replica batches that are multiples of 8
fill the matrix units better; `train.steps_per_execution` is how many steps one host call runs
(1 returns to the host after every step, which leaves a TPU idle between steps); and because XLA
needs static shapes, evaluation drops the last partial batch too (`drop_remainder=True`): an
evaluation split smaller than one global batch is then not evaluated at all.
"""
from __future__ import annotations

from tftrain import config_schema as config_lib
from tftrain.rules.report import ADVICE, ERROR, OK, Finding, Target
from tftrain.errors import ConfigError
from tftrain.training.steps import plan_steps

FAMILY = "batch"
TPU_BATCH_MULTIPLE = 8


def check(config, target: Target, manifest: dict | None = None) -> list[Finding]:
    """The batch split and, on TPU, steps per execution; with a manifest, the partial batches."""
    findings = [split(config, target)]
    if target.kind == "tpu":
        findings.append(steps_per_execution(config, manifest))
        if manifest is not None:
            findings += partial_batches(config, manifest)
    return findings


def split(config, target: Target) -> Finding:
    """`data.batch_size` over `target.replicas`, naming both numbers."""
    batch, replicas, word = config.data.batch_size, target.replicas, target.replica_word
    assumed = f" ({target.assumed})" if target.assumed else ""
    try:
        config_lib.check_divisible(batch, replicas)
    except ConfigError as e:
        return Finding(ERROR, FAMILY, f"{replicas} {word}s{assumed}: {e}")
    per_replica = batch // replicas
    accum = config.train.grad_accum_steps
    what = f"data.batch_size={batch} over {replicas} {word}s: {per_replica} per {word}{assumed}"
    if accum > 1:
        what += f", {accum} micro-batches per update ({batch * accum} examples per update)"
    if target.kind == "tpu" and per_replica % TPU_BATCH_MULTIPLE:
        return Finding(ADVICE, FAMILY, f"{what}, not a multiple of {TPU_BATCH_MULTIPLE}: the "
                       "TPU pads it and wastes matrix-unit work",
                       f"a per-{word} batch that is a multiple of {TPU_BATCH_MULTIPLE} (128 fills "
                       "the matrix units)")
    return Finding(OK, FAMILY, what)


def steps_per_execution(config, manifest) -> Finding:
    """What `train.steps_per_execution` means on a TPU: host round trips per epoch."""
    steps = config.train.steps_per_execution
    key = f"train.steps_per_execution={steps}"
    epoch = ""
    split = manifest.splits.get(config.data.train_split) if manifest else None
    if split is not None and split.num_examples is not None:
        plan = plan_steps(config.train, split.num_examples,
                          config.data.batch_size * config.train.grad_accum_steps)
        calls = -(-plan.steps_per_epoch // steps)
        epoch = (f"; an epoch of {plan.steps_per_epoch} steps takes {calls} host "
                 f"call{'s' if calls != 1 else ''}")
    if steps == 1:
        return Finding(ADVICE, FAMILY, f"{key}: every step returns to the host, and the TPU waits "
                       f"for the next call{epoch}", "set it to e.g. 50-200, or the steps per epoch")
    return Finding(OK, FAMILY, f"{key}: one host call runs {steps} TPU steps{epoch}")


def partial_batches(config, manifest) -> list[Finding]:
    """The validation and test splits under `drop_remainder=True` (TPU: static shapes)."""
    findings = []
    batch = config.data.batch_size
    for split in dict.fromkeys((config.data.eval_split, config.data.test_split)):
        count = manifest.splits[split].num_examples if split in manifest.splits else None
        if count is None:
            continue  # a missing split is reported by the data check
        full, dropped = divmod(count, batch)
        where = f"split {split!r} ({count} examples, data.batch_size={batch})"
        if full == 0:
            findings.append(Finding(
                ERROR, FAMILY, f"{where}: on TPU the last partial batch is dropped (static "
                "shapes), so nothing of it is evaluated",
                f"data.batch_size <= {count}, or a larger {split} split"))
        elif dropped:
            findings.append(Finding(
                ADVICE, FAMILY, f"{where}: on TPU the last partial batch is dropped (static "
                f"shapes): {dropped} examples are not evaluated",
                f"a data.batch_size that divides {count} counts every example"))
        else:
            findings.append(Finding(OK, FAMILY, f"{where}: {full} full batches, none dropped"))
    return findings

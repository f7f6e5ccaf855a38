"""`tftrain doctor`: why a run is slow, measured on the run itself.

`run` builds what `tftrain train` builds for a config (strategy, precision, the dataset's
manifest, the distributed training input, the compiled model) and times a few hundred steps of
it three ways (`measure`): the input alone, the model alone on batches replayed from memory,
and both together. Then it times truncated copies of the input to find the costliest stage
(`stages`), gives the verdict and tries the changes that could help (`advice`). `report`
renders the result. Nothing is written into the run's model_dir; a missing dataset is converted
exactly when `train` would convert it.
"""
from __future__ import annotations

import dataclasses

DEFAULT_STEPS = 100  # timed steps per measurement and round: well under a minute on digits


def run(config, steps: int = DEFAULT_STEPS, convert_data: bool = True) -> dict:
    """Measures the configured run; returns the result as a JSON-ready dict (see `report`)."""
    from tftrain.doctor import advice, measure, stages as stages_lib
    from tftrain.engine import backend_choice, prepare
    from tftrain.engine.utilization import Utilization

    # 1-2. The run `train` would start, built the same way (backend first: no TensorFlow op
    #      may run before it), on every backend. Nothing is written into its model_dir.
    backend = backend_choice.create(config)
    run_ = prepare.prepare(config, backend, convert_data=convert_data)
    config, examples = run_.config, run_.examples_per_step
    split_examples = run_.dataset.examples(config.data.train_split)
    replay = backend.replayed_data(config, measure.replay_batches(config))

    def fit_rate(trainer, dataset, execution: int = config.train.steps_per_execution) -> float:
        return measure.fit_rate(trainer, dataset, steps, examples, execution)

    def model_alone(model_config) -> float:  # a trial's model, on the same replayed batches
        trial = backend.build(model_config, run_.manifest, run_.plan)[1]
        return measure.best(lambda: fit_rate(trial, replay, model_config.train.steps_per_execution))

    # 3. Three ways: the input alone, the model alone on replayed batches, both together; in
    #    interleaved rounds, each way's best round counting (the machine may be shared).
    train_data = backend.training_data(config)
    fill = measure.steps_per_pass(config, split_examples) if config.data.cache != "none" else 0
    rates = measure.three_ways(
        lambda round_index: measure.input_rate(train_data, steps, examples,
                                               warmup=0 if round_index else fill),
        lambda: fit_rate(run_.trainer, replay), lambda: fit_rate(run_.trainer, train_data))

    # 4. Where the input's time goes, stage by stage (uncached and local).
    stages = stages_lib.measure_stages(backend, config, steps)

    # 5. The verdict, and the changes that help (tried here when they can be).
    verdict = advice.verdict(rates)
    usage = Utilization.of(run_.model, backend, run_.policy)
    if verdict == advice.INPUT_BOUND:
        tried, text, whys = advice.try_cache(backend, config, run_.dataset, rates, steps)
        tried += advice.try_autotune_off(backend, config, rates, steps, fill)
        whys[advice.AUTOTUNE_OFF] = advice.AUTOTUNE_WHY
        text += advice.input_text(config, run_.dataset, stages)
    else:
        tried = advice.try_steps_per_execution(config, rates, model_alone)
        text, whys = [], {t.change: advice.SPE_WHY for t in tried}
    return {
        "data_dir": config.data.dir,
        "strategy": backend.name,
        "num_replicas": backend.num_replicas,
        "mixed_precision": run_.policy,
        "examples_per_step": examples,
        "steps": steps,
        "rounds": measure.ROUNDS,
        "examples_per_second": {"input_alone": rates.input_alone,
                                "model_alone": rates.model_alone, "combined": rates.combined},
        "input_wait": rates.input_wait,
        "stages": [stages_lib.as_json(stage, stages) for stage in stages],
        "costliest_stage": stages_lib.costliest(stages).name,
        "verdict": verdict,
        "input_bound_margin": advice.INPUT_BOUND_MARGIN,
        "tried": [dataclasses.asdict(t) | {"speedup": t.speedup} for t in tried],
        "suggestions": [advice.suggestion_json(s) for s in advice.choose(tried, text, whys)],
        "utilization": utilization(usage, rates, verdict, run_.policy, backend.device_type,
                                   examples, config.train.steps_per_execution,
                                   precision_holds(config, run_.policy, backend.device_type)),
    }


SMALL_STEP_FLOPS = 1e9  # below this a step's matmuls are too small to keep a device busy
SHORT_STEP_SECONDS = 0.005  # below this per step, Python and the launch of each step weigh


def precision_holds(config, policy: str, device_type: str) -> list[str]:
    """How the precision (and XLA, on a CPU) holds the matmuls below what the device offers:
    on a CPU, the advice `tftrain check` gives for this host (`rules.precision`)."""
    from tftrain.rules import precision
    from tftrain.rules.report import ADVICE, Target

    if device_type in ("GPU", "TPU"):
        return [f"precision: float32 leaves the {device_type}'s 16-bit matmul units idle "
                "(runtime.mixed_precision=auto)"] if policy == "float32" else []
    return [f"precision: {finding.what} ({finding.fix})"
            for finding in precision.check(config, Target("cpu", 1))
            if finding.status == ADVICE]


def utilization(usage, rates, verdict: str, policy: str, device_type: str, examples: int,
                steps_per_execution: int, precision_held: list[str] = ()) -> dict:
    """MFU of the run (input + model) and of the model alone, and what holds it down."""
    from tftrain.doctor import advice

    usage = usage.confirmed(max(rates.combined, rates.model_alone))
    step_flops = usage.model_flops_per_example * examples
    step_seconds = examples / rates.model_alone
    held = []
    if verdict == advice.INPUT_BOUND:
        held.append(f"input: the step waits on input {rates.input_wait:.0%} of its time")
    held += precision_held
    if step_flops < SMALL_STEP_FLOPS:
        held.append(f"small matmuls: {step_flops / 1e6:,.1f} MFLOP per step; a larger "
                    "data.batch_size or model keeps the device busier")
    if step_seconds < SHORT_STEP_SECONDS and steps_per_execution == 1:
        held.append(f"host overhead: {1e3 * step_seconds:.1f} ms per step, each launched from "
                    "Python; train.steps_per_execution runs several per call")
    return {**usage.summary(rates.combined), "mfu_model_alone": usage.mfu(rates.model_alone),
            "held_down_by": held}

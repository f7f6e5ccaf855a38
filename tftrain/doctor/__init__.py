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

DEFAULT_STEPS = 100  # timed steps per measurement and round: well under a minute on digits


def run(config, steps: int = DEFAULT_STEPS, convert_data: bool = True) -> dict:
    """Measures the configured run; returns the result as a JSON-ready dict (see `report`)."""
    import tf_keras as keras

    from tftrain import config as config_lib
    from tftrain.engine import backends, precision, train
    from tftrain.runtime import distribute, tpu
    from tftrain.doctor import advice, measure, stages as stages_lib
    from tftrain.errors import DataError

    # 1. The strategy comes first (no TensorFlow op may run before it), as in `train`.
    strategy = distribute.create_strategy(config.runtime)
    config_lib.check_divisible(config.data.batch_size, strategy.num_replicas_in_sync)
    keras.utils.set_random_seed(config.train.seed)
    policy = precision.set_policy(config.runtime.mixed_precision, strategy)

    # 2. The data and the model `train` would use.
    manifest = train.ensure_dataset(config.data, True, convert_data)
    examples = measure.examples_per_step(config)
    split_examples = manifest["splits"][config.data.train_split]["num_examples"]
    if split_examples < examples:  # the training input drops partial batches: it would be empty
        raise DataError(f"split {config.data.train_split!r} of {config.data.dir} has "
                        f"{split_examples} examples, fewer than one step's {examples} "
                        "(data.batch_size x train.grad_accum_steps): lower data.batch_size")
    plan = train.plan_steps(config.train, split_examples, examples)
    tpu.check_ready(config, strategy)
    replay = measure.replayed(config)

    def compiled(model_config) -> keras.Model:
        with strategy.scope():
            return backends.build_and_compile(model_config, manifest, plan)[1]

    def fit_rate(trainer, dataset, execution: int = config.train.steps_per_execution) -> float:
        return measure.fit_rate(trainer, dataset, steps, examples, execution)

    def model_alone(model_config) -> float:  # a trial's model, on the same replayed batches
        trial = compiled(model_config)
        return measure.best(lambda: fit_rate(trial, replay, model_config.train.steps_per_execution))

    # 3. Three ways: the input alone, the model alone on replayed batches, both together; in
    #    interleaved rounds, each way's best round counting (the machine may be shared).
    train_data = measure.training_input(strategy, config)
    fill = measure.steps_per_pass(config, split_examples) if config.data.cache != "none" else 0
    trainer = compiled(config)
    input_alone = model_rate = combined = 0.0
    for round_index in range(measure.ROUNDS):
        input_alone = max(input_alone, measure.input_rate(train_data, steps, examples,
                                                          warmup=0 if round_index else fill))
        model_rate = max(model_rate, fit_rate(trainer, replay))
        combined = max(combined, fit_rate(trainer, train_data))
    rates = measure.Rates(input_alone, model_rate, combined)

    # 4. Where the input's time goes, stage by stage (uncached and local).
    stages = stages_lib.measure_stages(strategy, config, steps)

    # 5. The verdict, and the changes that help (tried here when they can be).
    verdict = advice.verdict(rates)
    if verdict == advice.INPUT_BOUND:
        tried, text, whys = advice.try_cache(strategy, config, manifest, rates, steps)
        tried += advice.try_autotune_off(strategy, config, rates, steps, fill)
        whys[advice.AUTOTUNE_OFF] = advice.AUTOTUNE_WHY
        text += advice.input_text(config, manifest, stages)
    else:
        tried = advice.try_steps_per_execution(config, rates, model_alone)
        text, whys = [], {t.change: advice.SPE_WHY for t in tried}
    return {
        "data_dir": config.data.dir,
        "strategy": distribute.strategy_name(strategy),
        "num_replicas": strategy.num_replicas_in_sync,
        "mixed_precision": policy,
        "examples_per_step": examples,
        "steps": steps,
        "rounds": measure.ROUNDS,
        "examples_per_second": {"input_alone": input_alone, "model_alone": model_rate,
                                "combined": combined},
        "input_wait": rates.input_wait,
        "stages": [{"name": s.name, "description": s.description, "examples_per_second": s.rate,
                    "seconds_per_example": s.seconds_per_example,
                    "share": (stages_lib.share(s, stages)
                              if s.seconds_per_example is not None else None), "note": s.note}
                   for s in stages],
        "costliest_stage": stages_lib.costliest(stages).name,
        "verdict": verdict,
        "input_bound_margin": advice.INPUT_BOUND_MARGIN,
        "tried": [{"change": t.change, "measured": t.measured, "before": t.before,
                   "after": t.after, "speedup": t.speedup} for t in tried],
        "suggestions": [{"change": s.change, "why": s.why, "speedup": s.speedup,
                         "measured": s.measured, "for_input": s.for_input, "line": s.line()}
                        for s in advice.choose(tried, text, whys)],
    }

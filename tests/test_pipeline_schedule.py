"""runtime.pipeline_schedule: the schedules as lists of actions (every pass once, in dependency
order; 1F1B holds min(S - s, M) micro-batches on stage s, GPipe all M; interleaved runs V chunks
per stage in Megatron-LM's order, counted per stage; the checks reject broken lists), and one
training run on the 2 virtual CPU devices of the test process: a transformer_lm
trained with 1f1b equals one device and gpipe, and its step's graph chains each stage's passes.
"""
import collections
import re

import pytest

from tests.test_pipeline import DEVICES, gathered, lm, lm_batch, max_difference, twin
from tftrain.errors import ConfigError
from tftrain.runtime import pipeline_schedule
from tftrain.runtime.pipeline_schedule import BACKWARD, FORWARD, Action

SHAPES = [(2, 1), (2, 4), (3, 2), (4, 4), (4, 8), (5, 3)]  # (stages, micro-batches)


def assert_valid(actions, stages, microbatches, virtual=1):
    """Every chunk (stage s's chunk v is the model's v * S + s; one per stage but under
    interleaved) runs every micro-batch's forward and backward exactly once; forward of m on
    chunk c after chunk c - 1's; backward after chunk c + 1's and after its own forward."""
    def at_chunk(c, m, kind):
        return Action(c % stages, m, kind, c // stages)

    chunks = stages * virtual
    expected = {at_chunk(c, m, kind) for c in range(chunks) for m in range(microbatches)
                for kind in (FORWARD, BACKWARD)}
    counts = collections.Counter(actions)
    assert set(counts) == expected and set(counts.values()) == {1}, counts
    at = {action: index for index, action in enumerate(actions)}
    for c in range(chunks):
        for m in range(microbatches):
            forward, backward = at[at_chunk(c, m, FORWARD)], at[at_chunk(c, m, BACKWARD)]
            assert forward < backward, (c, m)
            if c > 0:
                assert at[at_chunk(c - 1, m, FORWARD)] < forward, (c, m)
            if c < chunks - 1:
                assert at[at_chunk(c + 1, m, BACKWARD)] < backward, (c, m)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,microbatches", SHAPES)
def test_every_pass_runs_once_in_dependency_order(kind, stages, microbatches):
    assert_valid(pipeline_schedule.schedule(kind, stages, microbatches), stages, microbatches)


def test_the_checks_reject_a_wrong_schedule():
    actions = pipeline_schedule.schedule("1f1b", 3, 4)
    first_backward = actions.index(Action(1, 0, BACKWARD))
    early = actions[:]  # stage 1's backward of micro-batch 0 before stage 2's
    early.insert(actions.index(Action(2, 0, BACKWARD)), early.pop(first_backward))
    broken = [actions[1:] + actions[:1],  # stage 0's first forward last
              actions[:-1],  # a pass missing
              actions + actions[-1:],  # a pass twice
              early]
    for wrong in broken:
        with pytest.raises(AssertionError):
            assert_valid(wrong, 3, 4)


@pytest.mark.parametrize("stages,microbatches", SHAPES)
def test_1f1b_holds_min_of_stages_left_and_microbatches_gpipe_all(stages, microbatches):
    one_f_one_b = pipeline_schedule.schedule("1f1b", stages, microbatches)
    held = pipeline_schedule.max_in_flight(one_f_one_b, stages)
    assert held == [min(stages - s, microbatches) for s in range(stages)]
    assert max(held) <= stages
    for s in range(stages):  # warm-up forwards, one forward one backward, cool-down backwards
        kinds = "".join(a.kind[0] for a in one_f_one_b if a.stage == s)
        warmup = min(stages - s - 1, microbatches)
        assert kinds == "f" * warmup + "fb" * (microbatches - warmup) + "b" * warmup, (s, kinds)
    gpipe = pipeline_schedule.schedule("gpipe", stages, microbatches)
    assert pipeline_schedule.max_in_flight(gpipe, stages) == [microbatches] * stages


def test_max_in_flight_counts_from_the_list_and_the_bubble_is_the_same():
    actions = [Action(0, 0, FORWARD), Action(0, 1, FORWARD), Action(0, 0, BACKWARD),
               Action(1, 0, FORWARD), Action(0, 2, FORWARD), Action(0, 1, BACKWARD)]
    assert pipeline_schedule.max_in_flight(actions, 2) == [2, 1]
    for kind in ("gpipe", "1f1b"):
        assert pipeline_schedule.bubble_fraction(kind, 2, 4) == pytest.approx(0.2)
        assert pipeline_schedule.bubble_fraction(kind, 4, 8) == pytest.approx(3 / 11)
    with pytest.raises(ConfigError, match=r"runtime.pipeline_schedule='1f2b' is not one of "):
        pipeline_schedule.schedule("1f2b", 2, 4)


INTERLEAVED_SHAPES = [(2, 2, 2), (2, 4, 2), (2, 6, 3), (3, 6, 2), (4, 4, 2), (4, 8, 3)]


@pytest.mark.parametrize("stages,microbatches,virtual", INTERLEAVED_SHAPES)
def test_interleaved_runs_every_chunk_once_in_dependency_order_1f1b_per_device(
        stages, microbatches, virtual):
    """(S, M, V): each stage runs min(2 (S - s - 1) + (V - 1) S, M V) warm-up forwards, then
    one forward one backward, then the rest backwards; it holds at most one more pass's
    activations than it warms up, all its chunks' together."""
    actions = pipeline_schedule.schedule("interleaved", stages, microbatches, virtual)
    assert_valid(actions, stages, microbatches, virtual)
    held = pipeline_schedule.max_in_flight(actions, stages)
    total = microbatches * virtual
    for s in range(stages):
        kinds = "".join(a.kind[0] for a in actions if a.stage == s)
        warmup = min(2 * (stages - s - 1) + (virtual - 1) * stages, total)
        assert kinds == "f" * warmup + "fb" * (total - warmup) + "b" * warmup, (s, kinds)
        assert held[s] == min(warmup + 1, total), (s, held)
    for kind in ("1f1b", "gpipe"):  # the other schedules: one chunk, Action's default
        assert {a.virtual for a in pipeline_schedule.schedule(kind, stages, microbatches)} == {0}


def test_interleaved_per_device_order_is_megatrons_and_its_bubble_v_times_smaller():
    """S=2, M=4, V=2: stage 0 holds the model's chunks 0 and 2, stage 1 chunks 1 and 3. Stage
    0's forwards go through micro-batches in groups of S=2 per chunk (F0 F1 on chunk 0, then on
    chunk 2, then F2 F3 ...), its backwards the same from its last chunk (Megatron-LM's
    `get_model_chunk_id`, torch's ScheduleInterleaved1F1B)."""
    def order(stage):
        return " ".join(f"{a.kind[0].upper()}{a.microbatch}c{a.chunk(2)}" for a in
                        pipeline_schedule.stage_order("interleaved", 2, 4, stage, virtual=2))

    assert order(0) == ("F0c0 F1c0 F0c2 F1c2 F2c0 B0c2 F3c0 B1c2 F2c2 B0c0 F3c2 B1c0 "
                        "B2c2 B3c2 B2c0 B3c0")
    assert order(1) == ("F0c1 F1c1 F0c3 B0c3 F1c3 B1c3 F2c1 B0c1 F3c1 B1c1 F2c3 B2c3 "
                        "F3c3 B3c3 B2c1 B3c1")
    actions = pipeline_schedule.schedule("interleaved", 2, 4, 2)
    assert [a.stage for a in actions[:3]] == [0, 0, 1]  # chunk 1 waits for chunk 0's F0
    assert pipeline_schedule.max_in_flight(actions, 2) == [5, 3]
    # each pass counted by its chunk's size: stage 0's peak (F0 F1 on chunk 0 and on chunk 2,
    # then F2 on chunk 0) is 3 x chunk 0 + 2 x chunk 2.
    sizes = {0: 10, 1: 1, 2: 100, 3: 1000}
    peak = pipeline_schedule.peak_held(actions, 2, lambda a: sizes[a.chunk(2)])
    assert peak[0] == 3 * 10 + 2 * 100, peak
    assert pipeline_schedule.bubble_fraction("interleaved", 2, 4, 2) == pytest.approx(1 / 9)
    assert pipeline_schedule.bubble_fraction("interleaved", 4, 8, 2) == pytest.approx(3 / 19)


@pytest.mark.parametrize("args,message", [
    (("interleaved", 2, 4, 1), r"runtime.pipeline_schedule=interleaved needs "
                               r"runtime.virtual_stages >= 2 \(the chunks each stage holds\), "
                               r"got 1$"),
    (("1f1b", 2, 4, 2), r"runtime.virtual_stages=2 needs runtime.pipeline_schedule=interleaved "
                        r"\(1f1b runs one chunk per stage\): set it to 1$"),
    (("interleaved", 4, 6, 2), r"runtime.microbatches=6 is not a multiple of it: use "
                               r"runtime.microbatches=8$"),
])
def test_the_schedule_refuses_chunks_it_cannot_run_in_one_line(args, message):
    with pytest.raises(ConfigError, match=message) as raised:
        pipeline_schedule.schedule(*args)
    assert "\n" not in str(raised.value)


def test_the_config_takes_interleaved_with_virtual_stages_and_refuses_the_rest_in_one_line():
    from tftrain import config as config_lib

    def build(overrides, strategy="pipeline"):
        return config_lib.build_config("text_lm", {"runtime.strategy": strategy}, overrides)

    taken = build("runtime.pipeline_schedule=interleaved,runtime.virtual_stages=2")
    assert (taken.runtime.pipeline_schedule, taken.runtime.virtual_stages) == ("interleaved", 2)
    assert build("").runtime.virtual_stages == 1
    refused = {
        "runtime.pipeline_schedule=interleaved": "needs runtime.virtual_stages >= 2",
        "runtime.virtual_stages=3": "runtime.virtual_stages=3 needs runtime.pipeline_schedule="
                                    "interleaved \\(1f1b runs one chunk per stage\\)",
        "runtime.pipeline_schedule=interleaved,runtime.virtual_stages=2,runtime.microbatches=3":
            "runtime.microbatches=3 is not a multiple of it: use runtime.microbatches=4",
    }
    for overrides, message in refused.items():
        with pytest.raises(ConfigError, match=message) as raised:
            build(overrides)
        assert "\n" not in str(raised.value)
    with pytest.raises(ConfigError, match="runtime.virtual_stages=2 cuts pipeline stages into "
                                          "chunks: it needs runtime.strategy=pipeline"):
        build("runtime.virtual_stages=2", strategy="one_device")


# --- training ---------------------------------------------------------------------------


def scheduled(model, kind, microbatches=3):
    """`model` cut into 2 stages on the test devices, trained with SGD under `kind`."""
    import tf_keras as keras

    from tftrain.runtime import pipeline_model, pipeline_stages

    stages = pipeline_stages.build(model, pipeline_stages.plan(model, 2), DEVICES)
    trainer = pipeline_model.PipelineModel(stages, DEVICES, microbatches, schedule=kind)
    trainer.compile(optimizer=keras.optimizers.SGD(0.1),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return stages, trainer


def chained_per_stage(graph, actions, stages=2, virtual=1) -> bool:
    """Whether, in the step's `graph`, every op of each action of a stage is downstream of the
    stage's previous action (data or control edges; under interleaved, the previous action of
    any of the stage's chunks): the order cannot change at run time. Placeholders are left
    out: they are the step function's inputs (a variable's handle, captured where a chunk
    first reads it), there before any op runs."""
    from tftrain.runtime import pipeline_model

    scoped, children = collections.defaultdict(list), collections.defaultdict(list)
    for op in graph.get_operations():
        found = re.search(r"stage_\d+_(chunk_\d+_)?(forward|backward)_\d+", op.name)
        if found and op.type != "Placeholder":
            scoped[found.group()].append(op)
        for parent in [t.op for t in op.inputs] + op.control_inputs:
            children[parent].append(op)
    previous = {}
    for action in actions:
        scope = pipeline_model.scope(action, stages, virtual)
        if action.stage in previous:
            reached, frontier = set(), list(scoped[previous[action.stage]])
            while frontier:
                for child in children[frontier.pop()]:
                    if child not in reached:
                        reached.add(child)
                        frontier.append(child)
            if not scoped[scope] or not set(scoped[scope]) <= reached:
                return False
        previous[action.stage] = scope
    return True


def test_1f1b_trains_as_one_device_and_gpipe_in_a_chained_graph():
    import tensorflow as tf
    import tf_keras as keras

    model = lm(num_layers=1)
    reference = twin(model)
    reference.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    runs = {kind: scheduled(model, kind) for kind in ("1f1b", "gpipe")}
    for step in range(3):
        x, y = lm_batch(size=6, seed=step)
        reference.train_on_batch(x, y)
        for _, trainer in runs.values():
            trainer.train_on_batch(x, y)
    one_f_one_b, gpipe = (gathered(model, runs[kind][0]) for kind in ("1f1b", "gpipe"))
    assert max_difference(one_f_one_b, reference) < 1e-5
    assert max_difference(one_f_one_b, gpipe) < 1e-6
    assert max_difference(one_f_one_b, model) > 1e-3  # it did train
    x, y = lm_batch(size=6)
    batch = iter(tf.data.Dataset.from_tensors((tf.constant(x), tf.constant(y))))
    graph = runs["1f1b"][1].train_function.get_concrete_function(batch).graph
    # 3 micro-batches: stage 0 runs F0 F1 B0 F2 B1 B2 (warm-up, one forward one backward,
    # cool-down), stage 1 F0 B0 F1 B1 F2 B2.
    assert chained_per_stage(graph, pipeline_schedule.schedule("1f1b", 2, 3))

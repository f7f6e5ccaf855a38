"""runtime.pipeline_schedule: the schedules as lists of actions (every pass once, in dependency
order; 1F1B holds min(S - s, M) micro-batches on stage s, GPipe all M; the checks reject broken
lists), and one training run on the 2 virtual CPU devices of the test process: a transformer_lm
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


def assert_valid(actions, stages, microbatches):
    """Every stage runs every micro-batch's forward and backward exactly once; forward of m on
    stage s after stage s - 1's; backward after stage s + 1's and after its own forward."""
    expected = {Action(s, m, kind) for s in range(stages) for m in range(microbatches)
                for kind in (FORWARD, BACKWARD)}
    counts = collections.Counter(actions)
    assert set(counts) == expected and set(counts.values()) == {1}, counts
    at = {action: index for index, action in enumerate(actions)}
    for s in range(stages):
        for m in range(microbatches):
            forward, backward = at[Action(s, m, FORWARD)], at[Action(s, m, BACKWARD)]
            assert forward < backward, (s, m)
            if s > 0:
                assert at[Action(s - 1, m, FORWARD)] < forward, (s, m)
            if s < stages - 1:
                assert at[Action(s + 1, m, BACKWARD)] < backward, (s, m)


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


def chained_per_stage(graph, actions) -> bool:
    """Whether, in the step's `graph`, every op of each action of a stage is downstream of the
    stage's previous action (data or control edges): the order cannot change at run time."""
    scoped, children = collections.defaultdict(list), collections.defaultdict(list)
    for op in graph.get_operations():
        found = re.search(r"stage_\d+_(forward|backward)_\d+", op.name)
        if found:
            scoped[found.group()].append(op)
        for parent in [t.op for t in op.inputs] + op.control_inputs:
            children[parent].append(op)
    previous = {}
    for action in actions:
        scope = f"stage_{action.stage}_{action.kind}_{action.microbatch}"
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

"""Looking at and shrinking the step (issues 20 and 32), in this process (-m unit):
what `trainer.jit_compile=auto` compiles, several steps in one XLA
computation (`trainer.steps_per_xla_call`), a profiler trace of chosen steps
(`trainer.profile_steps`) and the gradients' all-reduce in 16 bits
(`strategy.all_reduce_dtype`). Real TensorFlow, real mirrored replicas on
logical CPU devices (engine_helpers)."""

import logging
import re

import numpy as np
import pytest
import tensorflow as tf

import user_plugins
import engine_helpers
from tfdistx.core import compute, strategies
from tfdistx.core.errors import ConfigError
from tfdistx.engine import xla
from tfdistx.engine.loop import Loop, Schedule
from tfdistx.engine.profiling import ProfileSteps
from tfdistx.models import mlp


def train(run_dir, *overrides, **kwargs):
    """engine_helpers.train with the default trainer.jit_compile (auto), what this file's claims are about."""
    return engine_helpers.train(run_dir, *overrides, xla_default=True, **kwargs)


def whole_and_resumed(tmp_path, args, **kwargs):
    return engine_helpers.whole_and_resumed(tmp_path, args, xla_default=True, **kwargs)


unit = (
    pytest.mark.unit
)  # every test (wide_deep's all-reduce case, in-process but ~23 s: test_fastest_step.py, the default run)

# What a profiler may change: how long it took (the run's, its checkpoints')
TIMES = (
    "examples_per_sec",
    "train_wall_time_sec",
    "wall_time_sec",
    *("save_sec", "save_sec_max", "save_sec_min", "stall_sec", "stall_sec_per_save", "final_save_sec"),
)


def _without_times(summary: dict) -> dict:
    return {
        k: ({m: v for m, v in s.items() if m not in TIMES} if isinstance(s, dict) else s)
        for k, s in summary.items()
        if k not in TIMES
    }


# -- trainer.steps_per_xla_call ----------------------------------------------


@unit
def test_steps_in_one_xla_call_train_bitwise_what_one_step_a_call_trains(tmp_path):
    """8 steps a call: 45 steps in loops of 10 (each loop 1 call of 8 and 2
    single steps, the last loop 5 single steps), a warm-up schedule that
    changes the rate every step, and 2 micro-batches a step. The weights,
    every logged metric and the evaluation equal one step a call's; so does
    a run stopped at step 21 and resumed (its calls fall on other steps)."""
    args = [
        "strategy=one_device",
        "trainer.jit_compile=true",
        "trainer.steps=45",
        "optimizer.schedule=warmup_cosine",
        "optimizer.warmup_steps=30",
        "trainer.accumulate_steps=2",
        "trainer.log_every=15",
    ]
    one = train(tmp_path / "one", *args, "trainer.steps_per_xla_call=1")
    eight = train(tmp_path / "eight", *args, "trainer.steps_per_xla_call=8")
    assert (one.summary["steps_per_xla_call"], eight.summary["steps_per_xla_call"]) == (1, 8)
    assert eight.summary["weights_sha256"] == one.summary["weights_sha256"]
    drop = {"examples_per_sec"}
    assert [{k: v for k, v in m.items() if k not in drop} for m in eight.metrics] == [
        {k: v for k, v in m.items() if k not in drop} for m in one.metrics
    ]
    assert [m["step"] for m in one.metrics] == [15, 30, 45]
    assert eight.summary["eval"] == one.summary["eval"]
    train(tmp_path / "split", *args, "trainer.steps_per_xla_call=8", "trainer.steps=21")
    resumed = train(tmp_path / "split", *args, "trainer.steps_per_xla_call=8")
    assert (
        resumed.summary["resumed_from_step"] == 21
        and resumed.summary["weights_sha256"] == one.summary["weights_sha256"]
    )


@unit
def test_auto_takes_several_steps_a_call_for_a_dense_models_whole_step_and_1_elsewhere(tmp_path, caplog):
    """engine_helpers.QUICK: 10 steps a loop, a log every 20, checkpoints every 500: 10 steps a call.
    The log says what was chosen in a few words (the rule is --plan's and the README's)."""
    caplog.set_level("INFO", logger="tfdistx")
    assert train(tmp_path / "mlp", "strategy=one_device").summary["steps_per_xla_call"] == 10
    said = [r.getMessage() for r in caplog.records if "XLA" in r.getMessage()]
    assert said == ["compute float32; XLA on (auto): a model of Dense layers, on CPUs; steps per XLA call 10 (auto)"]
    assert train(tmp_path / "mirrored", "strategy=mirrored", "cluster=1x2").summary["steps_per_xla_call"] == 1


@unit
def test_auto_leaves_xla_off_for_accumulated_steps_on_cpus(tmp_path):
    """Issue 32 (18): the README's `data.batch_size=256 trainer.accumulate_steps=8`
    trained 15.8k examples/s under auto (XLA, 10 steps a call) against 133k
    with XLA off; compiled, such a step stays slower than not on CPUs
    (benchmarks/bench_accumulation.py). The same weights as jit_compile=false."""
    auto = train(tmp_path / "auto", "strategy=one_device", "trainer.accumulate_steps=4")
    off = train(tmp_path / "off", "strategy=one_device", "trainer.accumulate_steps=4", "trainer.jit_compile=false")
    assert (auto.summary["jit_compile"], auto.summary["steps_per_xla_call"]) == (False, 1)
    assert auto.summary["weights_sha256"] == off.summary["weights_sha256"]


# -- trainer.jit_compile=auto: what the model really holds, and a step XLA cannot compile ------------


HISTOGRAM = [
    "model._target_=user_plugins.histogram_model"
]  # Dense sublayers, a weight of its own, a bincount in its call
BALANCED = ["task._target_=user_plugins.BalancedClassification"]  # the default MLP; a bincount in the loss


@unit
def test_auto_reads_every_weight_and_every_op_of_the_model():
    """A weight the model holds itself counts for the model's own class; the
    forward pass's ops are read from a trace of it. The default MLP, dropout
    included, is Dense layers and Dense ops only."""
    spec = tf.TensorSpec([28, 28, 1])
    histogram = user_plugins.histogram_model((28, 28, 1), 10)
    assert xla.weighted_layer_kinds(histogram) == {"Dense", "HistogramModel"}
    ops = xla.forward_op_types(histogram, spec)
    assert "DenseBincount" in ops and not {"MatMul", "Relu"} - ops
    assert compute.decide_jit(
        "auto", strategies.get("one_device"), False, xla.weighted_layer_kinds(histogram), ops
    ) == (False, "off (auto): on CPUs, and this model has HistogramModel weights and DenseBincount, GatherV2, Size ops")
    seeds = mlp((28, 28, 1), 10, hidden_units=[128], dropout=0.5)
    assert xla.weighted_layer_kinds(seeds) == {"Dense"}
    assert xla.forward_op_types(seeds, spec) <= compute.DENSE_MODEL_OPS


@unit
def test_a_users_model_with_a_weight_of_its_own_and_a_bincount_trains_under_auto(tmp_path):
    """Issue 32 (17): it was classed all Dense, compiled 10 steps a call, and
    failed at its first step with "Graph execution error". Auto leaves XLA
    off: the same weights as trainer.jit_compile=false."""
    auto = train(tmp_path / "auto", "strategy=one_device", *HISTOGRAM)
    off = train(tmp_path / "off", "strategy=one_device", *HISTOGRAM, "trainer.jit_compile=false")
    assert (auto.summary["step"], auto.summary["jit_compile"], auto.summary["steps_per_xla_call"]) == (40, False, 1)
    assert auto.summary["weights_sha256"] == off.summary["weights_sha256"]


def _warnings(caplog) -> list:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("tfdistx")]


@unit
def test_a_step_xla_cannot_compile_trains_without_it_under_auto_and_says_so_once(tmp_path, caplog):
    """The model is Dense layers (auto compiles it) but the loss counts the
    labels with a bincount XLA cannot compile: found before the first step,
    the run trains as with trainer.jit_compile=false, bitwise, resumed or not,
    and says why in one warning. Nothing is read or changed by the check."""
    caplog.set_level("INFO", logger="tfdistx")
    whole, resumed = whole_and_resumed(tmp_path, ["strategy=one_device", *BALANCED])
    off = train(tmp_path / "off", "strategy=one_device", *BALANCED, "trainer.jit_compile=false")
    assert (whole.summary["jit_compile"], whole.summary["steps_per_xla_call"]) == (False, 1)
    assert whole.summary["weights_sha256"] == resumed.summary["weights_sha256"] == off.summary["weights_sha256"]
    said = _warnings(caplog)
    assert len(said) == 3  # once for each of the three runs compiled under auto: whole, stopped, resumed
    for line in said:  # TensorFlow's own first line, naming the op (its node's name depends on where it was traced)
        assert re.fullmatch(
            r"trainer.jit_compile=auto: XLA cannot compile this run's step \(Input 1 to node "
            r"`\S*bincount/DenseBincount` with op DenseBincount must be a compile-time constant.\): "
            r"training without XLA",
            line,
        ), line


@unit
def test_jit_compile_true_on_a_step_xla_cannot_compile_is_refused_in_one_line(tmp_path):
    """Not exit 1 with "Graph execution error" at the first step: exit 2, the
    key named, before any step; no checkpoint is written."""
    with pytest.raises(ConfigError) as refused:
        train(
            tmp_path / "run",
            "strategy=one_device",
            *BALANCED,
            "trainer.jit_compile=true",
            "trainer.steps_per_xla_call=1",
        )
    lines = refused.value.lines()
    assert len(lines) == 1 and re.fullmatch(
        r"tfdistx: invalid config: trainer.jit_compile=True: XLA cannot compile this run's step: "
        r"Input 1 to node `\S*bincount/DenseBincount` with op DenseBincount must be a compile-time "
        r"constant: use false or auto",
        lines[0],
    ), lines
    assert not (tmp_path / "run" / "checkpoints").exists() or not any((tmp_path / "run" / "checkpoints").iterdir())


@unit
@pytest.mark.parametrize(
    "overrides, line",
    [
        # Issue 32 (16): auto leaves XLA off for a convolutional model on CPUs, and N became 1 silently.
        (
            ["model=cnn", "trainer.steps_per_xla_call=7"],
            "trainer.steps_per_xla_call=7: more than 1 only where XLA compiles the whole step, and XLA is off (auto): "
            "on CPUs, and this model has Conv2D weights and Conv2D, MaxPool ops: set trainer.jit_compile=true to "
            "compile it anyway, or trainer.steps_per_xla_call=1",
        ),
        (
            [*BALANCED, "trainer.steps_per_xla_call=5"],
            "trainer.steps_per_xla_call=5: more than 1 only where XLA compiles the whole step, and XLA is off: it "
            "cannot compile this run's step: set trainer.steps_per_xla_call=1 or auto",
        ),
    ],
)
def test_steps_per_xla_call_above_1_where_auto_does_not_compile_the_step_is_refused(tmp_path, overrides, line):
    with pytest.raises(ConfigError) as refused:
        train(tmp_path / "run", "strategy=one_device", *overrides)
    assert refused.value.lines() == [f"tfdistx: invalid config: {line}"]


# -- trainer.profile_steps ---------------------------------------------------


@unit
def test_a_profile_of_chosen_steps_is_in_the_runs_tensorboard_dir_and_changes_nothing(tmp_path, mlp_float32):
    """logger.tensorboard=false (engine_helpers.QUICK): the trace goes to
    <run dir>/tensorboard all the same. [5, 15] moves the loop's calls off
    its own stops (every 10 steps), and the run still ends bitwise equal."""
    plain = mlp_float32  # mirrored 1x2, float32's all-reduce (the default, written out)
    traced = train(tmp_path / "traced", *MIRRORED, "strategy.all_reduce_dtype=float32", "trainer.profile_steps=[5,15]")
    traces = list((traced.dir / "tensorboard" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0, traces
    assert not (plain.dir / "tensorboard").exists()
    assert traced.summary["weights_sha256"] == plain.summary["weights_sha256"]
    assert _without_times(traced.summary) == _without_times(plain.summary)
    assert [{k: v for k, v in m.items() if k not in TIMES} for m in traced.metrics] == [
        {k: v for k, v in m.items() if k not in TIMES} for m in plain.metrics
    ]


class _Runner:
    """The loop's side of a runner, recording each call and whether the profiler ran during it."""

    def __init__(self, action):
        self.action, self.calls = action, []

    def train(self, first_step, num_steps):
        self.calls.append((first_step, num_steps, self.action.tracing_from is not None))
        return np.zeros(1)

    def results(self, totals):
        return {}

    def examples(self, totals):
        return 0.0

    def evaluate(self):
        return {}


class _Counter:
    def __init__(self, step):
        self.step = step

    def numpy(self):
        return self.step

    def assign(self, step):
        self.step = step


@unit
@pytest.mark.parametrize(
    "first_step, calls",
    [
        (0, [(0, 5, False), (5, 10, True), (15, 5, False), (20, 10, False), (30, 10, False)]),
        (
            10,
            [(10, 5, True), (15, 5, False), (20, 10, False), (30, 10, False)],
        ),  # resumed inside the span: traced from there
    ],
)
def test_the_trace_brackets_exactly_the_steps_asked_for(tmp_path, first_step, calls):
    action = ProfileSteps(5, 15, tmp_path / "tensorboard")
    runner = _Runner(action)
    Loop(
        runner, Schedule(steps=40, steps_per_loop=10, log_every=20, eval_every=0), _Counter(first_step), [action]
    ).run()
    assert runner.calls == calls
    assert len(list((tmp_path / "tensorboard" / "plugins" / "profile").glob("*/*.xplane.pb"))) == 1


# -- strategy.all_reduce_dtype -----------------------------------------------

# Measured here (2026-11-25, this 2-core Xeon, TF 2.21), mirrored 1x2, 40 steps of 32 (engine_helpers.QUICK),
# deterministic: the largest difference of any weight from the float32 run's, and the difference's norm over the
# weights' norm.
#   the default MLP, Adam 1e-3:       bfloat16 8.43e-3 (rel. 9.85e-3), float16 3.3e-4 (rel. 6.47e-5)
#   wide_deep (sparse tables), Adam:  bfloat16 8.34e-3 (rel. 3.64e-3), float16 1.55e-3 (rel. 8.6e-4)
# bfloat16 keeps 8 significant bits and float16 11: after one step the difference is the rounding of one update
# (SGD: at most 5e-5 here); over 40 steps the runs' paths part further. The tolerances are ~20% above what was measured.
MLP = []
WIDE_DEEP = [
    "data=synthetic_categorical",
    "model=wide_deep",
    "model.vocab_size=1000",
    "data.vocab_size=1000",
    "task=binary",
]
TOLERANCES = {  # (model, dtype): (max abs difference, relative difference)
    ("mlp", "bfloat16"): (0.01, 0.012),
    ("mlp", "float16"): (4e-4, 8e-5),
    ("wide_deep", "bfloat16"): (0.01, 0.0045),
}


def _difference(a, b):
    """(the largest absolute difference of any weight, ||a - b|| / ||b|| over all weights)."""
    wa, wb = a.weights(), b.weights()
    assert wa.keys() == wb.keys() and wa
    worst = max(float(np.max(np.abs(wa[k] - wb[k]))) for k in wa)
    relative = float(np.sqrt(sum(np.sum((wa[k] - wb[k]) ** 2) for k in wa) / sum(np.sum(wb[k] ** 2) for k in wa)))
    return worst, relative


MIRRORED = ["strategy=mirrored", "cluster=1x2", "trainer.deterministic=true"]


@pytest.fixture(scope="module")
def mlp_float32(tmp_path_factory):
    """The default MLP on mirrored 1x2, all-reduced in float32: the reference of the 16-bit all-reduce, of
    the step without the key and of the profiled run. Trained once a module in each pytest worker (three
    tests trained it each, ~1.5 CPU s with XLA); they only read it."""
    return train(tmp_path_factory.mktemp("mlp_float32") / "float32", *MIRRORED, "strategy.all_reduce_dtype=float32")


def assert_16_bit_all_reduce_trains_close_to_float32(tmp_path, model, overrides, dtypes, float32=None):
    """Mirrored 1x2: each of `dtypes` as strategy.all_reduce_dtype trains weights
    within TOLERANCES of float32's, and not equal to them (it was not float32).
    `float32`: that run, when trained already."""
    args = [*MIRRORED, *overrides]
    float32 = float32 or train(tmp_path / "float32", *args, "strategy.all_reduce_dtype=float32")
    for dtype in dtypes:
        run = train(tmp_path / dtype, *args, f"strategy.all_reduce_dtype={dtype}")
        worst, relative = _difference(run, float32)
        tolerance, relative_tolerance = TOLERANCES[model, dtype]
        assert 0 < worst < tolerance and relative < relative_tolerance, (
            dtype,
            worst,
            relative,
        )  # 0 <: it was not float32


@unit
def test_gradients_all_reduced_in_16_bits_train_weights_close_to_float32(tmp_path, mlp_float32):
    """The default MLP (wide_deep's sparse tables, ~23 s: test_fastest_step.py)."""
    assert_16_bit_all_reduce_trains_close_to_float32(tmp_path, "mlp", MLP, ["bfloat16", "float16"], float32=mlp_float32)


@unit
def test_float32_all_reduce_is_the_step_without_the_key(tmp_path, mlp_float32):
    float32 = mlp_float32
    without = train(tmp_path / "without", *MIRRORED, "~strategy.all_reduce_dtype")
    assert "all_reduce_dtype" not in without.spec.strategy.options
    assert float32.summary["weights_sha256"] == without.summary["weights_sha256"]

"""How a step computes: XLA and precision, decided without TensorFlow.

Validation refuses what cannot work before TensorFlow starts, `--plan` says
what `trainer.jit_compile=auto` will choose, and the engine asks the same
function once it knows whether there are GPUs and what layers the model has
(engine/build.py).

What `auto` chooses follows the benchmarks (docs/performance.md: XLA on
CPUs, and benchmarks/bench_compute.py). XLA's CPU convolutions do not use
oneDNN, and its sparse updates are dense scatters; what it wins is fusing a
dense model's many small kernels, the optimizer's update most of all, and
only when the whole step is compiled (with the gradients alone compiled,
under mirrored and multiworker, the update runs outside and nothing is
won). So on CPUs `auto` compiles the whole step (one_device) of a model
whose weighted layers are all Dense, and nothing else; with GPUs (what XLA
is built for) it compiles.
"Made of Dense layers" is read from the built model (engine/xla.py):
every weight belongs to a Dense layer (not to a custom layer or the model
itself), and every op of its forward pass is one a Dense model is made of
(DENSE_MODEL_OPS). Under `auto`, a step XLA cannot compile after all (an op
without an XLA kernel, a shape known only at run time) trains without XLA,
said in one warning. A step of several micro-batches
(`trainer.accumulate_steps`) trained slower compiled than not on CPUs
(benchmarks/bench_accumulation.py): `auto` leaves XLA off for it there.

`trainer.steps_per_xla_call`: compiled whole, K consecutive steps can be one
XLA computation (engine/update.py), which saves each call's fixed cost, a
large part of a small dense step on CPUs; the weights are bitwise the same.
A few steps a call already save most of it, so `auto` takes up to 10 steps
a call for the whole step of a model of Dense layers on CPUs, and 1
elsewhere: a convolutional model's step is long beside a call's cost, and
with GPUs the gain is not shown. The K batches are stacked (K batches more
in memory).
"""

from typing import Iterable, List, Optional, Tuple

from tfdistx.core import strategies
from tfdistx.core.errors import Problem

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
JIT_COMPILE = (True, False, "auto")


# Layers (by class name) whose models XLA trains faster on CPUs, compiled whole (docs/performance.md).
FASTER_UNDER_XLA_ON_CPU = frozenset({"Dense"})
# The ops (TensorFlow op types) of the forward pass of a model of Dense layers: matmuls, elementwise
# arithmetic and activations, reductions, shapes, casts (mixed precision), variable reads and the
# stateless random numbers of dropout; what XLA fuses. Any other op (a convolution, a gather, a
# bincount, control flow) means the model is not one `auto` compiles on CPUs.
DENSE_MODEL_OPS = frozenset(
    {
        "Placeholder",
        "Const",
        "Identity",
        "IdentityN",
        "NoOp",
        "PartitionedCall",
        "StatefulPartitionedCall",
        "ReadVariableOp",
        "AssignVariableOp",
        "Cast",
        "MatMul",
        "BatchMatMulV2",
        "BiasAdd",
        "AddV2",
        "Sub",
        "Mul",
        "RealDiv",
        "Neg",
        "Maximum",
        "Minimum",
        "Abs",
        "Square",
        "Sqrt",
        "Rsqrt",
        "Exp",
        "Log",
        "Log1p",
        "Pow",
        "Erf",
        "Erfc",
        "FloorMod",
        "Sign",
        "Relu",
        "Relu6",
        "Elu",
        "Selu",
        "LeakyRelu",
        "Sigmoid",
        "Tanh",
        "Softplus",
        "Softsign",
        "Softmax",
        "LogSoftmax",
        "Greater",
        "GreaterEqual",
        "Less",
        "LessEqual",
        "Equal",
        "NotEqual",
        "LogicalAnd",
        "LogicalOr",
        "LogicalNot",
        "Select",
        "SelectV2",
        "Sum",
        "Mean",
        "Max",
        "Min",
        "Reshape",
        "Squeeze",
        "ExpandDims",
        "Transpose",
        "ConcatV2",
        "Pack",
        "StridedSlice",
        "Shape",
        "Fill",
        "ZerosLike",
        "OnesLike",
        "StatelessRandomGetKeyCounter",
        "StatelessRandomUniformV2",
        "StatelessRandomNormalV2",
    }
)
_CPU_RULE = (
    "on CPUs XLA pays only for a dense model's whole step, and slows convolutions and embeddings (docs/performance.md)"
)


def planned_jit(trainer, row: strategies.StrategyRow, gpus: Optional[bool] = None) -> Tuple[Optional[bool], str]:
    """jit_compile of a config's or a RunSpec's `trainer` (their keys are the same), before the model is built."""
    return decide_jit(trainer.jit_compile, row, gpus, accumulate_steps=trainer.accumulate_steps)


def decide_jit(
    asked,
    row: strategies.StrategyRow,
    gpus: Optional[bool] = None,
    layers: Optional[Iterable[str]] = None,
    ops: Iterable[str] = (),
    accumulate_steps: int = 1,
) -> Tuple[Optional[bool], str]:
    """(compile with XLA?, why) for `trainer.jit_compile` = `asked`; `gpus`:
    whether TensorFlow found GPUs, `layers`: the class names of the layers
    that hold the model's weights (None: not known yet, and the answer may be
    None), `ops`: the op types of its forward pass, `accumulate_steps`:
    micro-batches a step. Known (the engine, once the model is built), why
    is a few words for the run's log; not known (--plan), it is the whole rule."""
    if asked is False:
        return False, "off (trainer.jit_compile=false)"
    if row.no_xla:  # only `auto` gets here: `true` is refused by problems()
        return False, (
            f"off (auto): strategy={row.name}: {row.no_xla}"
            if layers is None
            else f"off (auto): strategy={row.name} cannot use it"
        )
    if asked is True:
        return True, "on (trainer.jit_compile=true)" + (
            "" if row.xla_whole_step else ": the gradients; the sum and update outside"
        )
    if gpus:
        return True, "on (auto): GPUs"
    if not row.xla_whole_step:
        return False, (
            f"off (auto): {_CPU_RULE}, and strategy={row.name} compiles only the gradients"
            if layers is None
            else f"off (auto): on CPUs, and strategy={row.name} would compile only the gradients"
        )
    if accumulate_steps > 1:
        return (False if gpus is False else None), (
            f"off (auto): on CPUs, with trainer.accumulate_steps={accumulate_steps}"
            if layers is not None
            else f"auto: on with GPUs; off on CPUs with trainer.accumulate_steps={accumulate_steps} (a step of "
            f"{accumulate_steps} micro-batches trained slower compiled: docs/performance.md)"
        )
    if gpus is None or layers is None:
        return None, f"auto: on with GPUs; on CPUs on for a model of Dense layers only, else off ({_CPU_RULE})"
    beyond = beyond_dense(layers, ops)
    if beyond:
        return False, f"off (auto): on CPUs, and this model has {beyond}"
    return True, "on (auto): a model of Dense layers, on CPUs"


def decided_by_the_model(asked, row: strategies.StrategyRow, gpus: bool, accumulate_steps: int) -> bool:
    """Whether decide_jit needs what the model is made of (the op types of its forward pass cost a trace)."""
    return asked == "auto" and not gpus and row.xla_whole_step and not row.no_xla and accumulate_steps == 1


def beyond_dense(layers: Iterable[str], ops: Iterable[str]) -> str:
    """What makes a model more than Dense layers, in a few words ('' when nothing does)."""
    parts = []
    others = sorted(set(layers) - FASTER_UNDER_XLA_ON_CPU)
    if others:
        parts.append(f"{', '.join(others)} weights")
    other_ops = sorted(set(ops) - DENSE_MODEL_OPS)
    if other_ops:
        parts.append(f"{', '.join(other_ops[:3])}{' ...' if len(other_ops) > 3 else ''} ops")
    return " and ".join(parts)


MOST_STEPS_PER_XLA_CALL = 10  # the most `auto` takes (more steps a call saved no more in the benchmarks)
_PER_CALL_RULE = "each call's fixed cost saved, a large part of a small dense step (docs/performance.md)"


def planned_steps_per_xla_call(
    trainer, checkpoint, row: strategies.StrategyRow, gpus: Optional[bool] = None
) -> Tuple[Optional[int], str]:
    """steps_per_xla_call of a config's or a RunSpec's `trainer` and `checkpoint` (what --plan says)."""
    return decide_steps_per_xla_call(
        getattr(trainer, "steps_per_xla_call", "auto"),
        planned_jit(trainer, row, gpus)[0],
        row,
        trainer.steps_per_loop,
        loop_periods(trainer, checkpoint),
        gpus,
        accumulate_steps=trainer.accumulate_steps,
    )


def loop_periods(trainer, checkpoint) -> Tuple[int, int, int]:
    """The loop's periods besides steps_per_loop (0: none): logging, evaluation, checkpoints;
    of a config or a RunSpec, whose trainer and checkpoint keys are the same."""
    return trainer.log_every, trainer.eval_every, checkpoint.every_steps


def decide_steps_per_xla_call(
    asked,
    jit: Optional[bool],
    row: strategies.StrategyRow,
    steps_per_loop: int,
    every: Iterable[int] = (),
    gpus: Optional[bool] = None,
    layers: Optional[Iterable[str]] = None,
    ops: Iterable[str] = (),
    accumulate_steps: int = 1,
) -> Tuple[Optional[int], str]:
    """(consecutive steps in one XLA computation, why) for `trainer.steps_per_xla_call` = `asked`,
    once `decide_jit` has said `jit`. `every`: the loop's other periods (logging, evaluation,
    checkpoints; 0: none). At most `steps_per_loop`. `auto` takes the most steps, up to
    MOST_STEPS_PER_XLA_CALL, that divide all of them: every call of the loop is then whole calls
    of K steps, and the computation of a single step, for the steps left over, is never compiled.
    N > 1 where XLA does not compile the whole step is refused: by problems() where the config
    says so, by steps_per_xla_call_problem() where `auto` decided it from the model."""
    if jit is False or not row.xla_whole_step:
        return 1, "1 (XLA does not compile the whole step here)"
    if asked != "auto":
        steps = min(int(asked), steps_per_loop)
        capped = f", capped by trainer.steps_per_loop={steps_per_loop}" if steps < int(asked) else ""
        return (steps if jit else None), f"{steps} (trainer.steps_per_xla_call={asked}{capped})"
    if gpus:
        return 1, "1 (auto): with GPUs (the saving is shown on CPUs: docs/performance.md)"
    if (
        accumulate_steps > 1
    ):  # slower at 10 than at 1 in benchmarks/bench_accumulation.py: K steps of N micro-batches stacked
        return 1, f"1 (auto): a step of {accumulate_steps} micro-batches is long beside a call's cost"
    periods = [steps_per_loop, *(n for n in every if n)]
    steps = max(k for k in range(1, MOST_STEPS_PER_XLA_CALL + 1) if all(n % k == 0 for n in periods))
    if gpus is None or layers is None:
        return None, (
            f"auto: {steps} for the whole step of a model of Dense layers on CPUs ({_PER_CALL_RULE}; the most, up to "
            f"{MOST_STEPS_PER_XLA_CALL}, that divide the steps per loop, log, eval and checkpoint), else 1"
        )
    if beyond_dense(layers, ops):
        return 1, "1 (auto): a model beyond Dense layers"
    return steps, f"{steps} (auto)"


def steps_per_xla_call_problem(
    asked,
    jit: bool,
    jit_why: str,
    fix: str = "set trainer.jit_compile=true to compile it anyway, or trainer.steps_per_xla_call=1",
) -> Optional[Problem]:
    """N > 1 steps per XLA call where `trainer.jit_compile=auto` did not compile the whole step:
    what problems() refuses where the config says so, found once the model is built."""
    if asked != "auto" and int(asked) > 1 and not jit:
        return Problem(
            "trainer.steps_per_xla_call",
            asked,
            f"more than 1 only where XLA compiles the whole step, and XLA is {jit_why}: {fix}",
        )
    return None


def precision_warning(precision: str, gpus: bool) -> Optional[str]:
    if precision == "mixed_float16" and not gpus:
        return (
            "trainer.precision=mixed_float16 without GPUs: CPUs emulate float16 arithmetic, many times slower than "
            "float32 (docs/performance.md; mixed_bfloat16 is the CPU's and TPU's half precision)"
        )
    return None


def problems(row: Optional[strategies.StrategyRow], jit_compile, steps_per_xla_call, precision) -> List[Problem]:
    """Combinations of strategy (its row, `row`; None: a strategy the
    strategy check names), precision and XLA (trainer.jit_compile,
    trainer.steps_per_xla_call) that cannot work."""
    if row is None:
        return []  # named by the strategy check
    found = []
    if jit_compile is True and row.no_xla:
        found.append(
            Problem("trainer.jit_compile", True, f"strategy={row.name} cannot use XLA: {row.no_xla}; use false or auto")
        )
    per_call = steps_per_xla_call
    if isinstance(per_call, int) and per_call > 1 and (jit_compile is False or not row.xla_whole_step):
        found.append(
            Problem(
                "trainer.steps_per_xla_call",
                per_call,
                "more than 1 only where XLA compiles the whole step: strategy=one_device, trainer.jit_compile true or "
                "auto",
            )
        )
    if precision in PRECISIONS and precision not in row.precisions:
        found.append(
            Problem(
                "trainer.precision",
                precision,
                f"strategy={row.name} runs {', '.join(row.precisions)} (TPUs compute in bfloat16)",
            )
        )
    return found

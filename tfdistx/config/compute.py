"""How a step computes: XLA and precision, decided without TensorFlow.

Validation refuses what cannot work before TensorFlow starts, `--plan` says
what `trainer.jit_compile=auto` will choose, and the engine asks the same
function once it knows whether there are GPUs and what layers the model has
(engine/build.py).

What `auto` chooses follows the benchmarks (README, Performance: XLA on
CPUs, and benchmarks/bench_compute.py). XLA's CPU convolutions do not use
oneDNN, and its sparse updates are dense scatters; what it wins is fusing a
dense model's many small kernels, the optimizer's update most of all, and
only when the whole step is compiled (with the gradients alone compiled,
under mirrored and multiworker, the update runs outside and nothing is
won). So on CPUs `auto` compiles the whole step (one_device) of a model
whose weighted layers are all Dense, and nothing else; with GPUs (what XLA
is built for) it compiles.

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

from tfdistx.config import strategies
from tfdistx.config.errors import Problem

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
JIT_COMPILE = (True, False, "auto")


# Layers (by class name) whose models XLA trains faster on CPUs, compiled whole (README, Performance).
FASTER_UNDER_XLA_ON_CPU = frozenset({"Dense"})
_CPU_RULE = "on CPUs XLA pays only for a dense model's whole step, and slows convolutions and embeddings (README, Performance)"


def jit_compile(cfg, gpus: Optional[bool] = None) -> Tuple[Optional[bool], str]:
    """(compile with XLA?, why) for the config's `trainer.jit_compile`."""
    return decide_jit(cfg.trainer.jit_compile, _facts(cfg), gpus)


def decide_jit(asked, facts: strategies.Strategy, gpus: Optional[bool] = None,
               layers: Optional[Iterable[str]] = None) -> Tuple[Optional[bool], str]:
    """(compile with XLA?, why) for `trainer.jit_compile` = `asked`; `gpus`:
    whether TensorFlow found GPUs, `layers`: the class names of the model's
    layers that hold weights (None: not known yet, and the answer may be None)."""
    if asked is False:
        return False, "off (trainer.jit_compile=false)"
    if facts.no_xla:  # only `auto` gets here: `true` is refused by problems()
        return False, f"off (auto): strategy={facts.name}: {facts.no_xla}"
    if asked is True:
        return True, "on (trainer.jit_compile=true)" + ("" if facts.xla_whole_step else ": the gradients; the sum and update outside")
    if gpus:
        return True, "on (auto): GPUs"
    if not facts.xla_whole_step:
        return False, f"off (auto): {_CPU_RULE}, and strategy={facts.name} compiles only the gradients"
    if gpus is None or layers is None:
        return None, f"auto: on with GPUs; on CPUs on for a model of Dense layers only, else off ({_CPU_RULE})"
    others = sorted(set(layers) - FASTER_UNDER_XLA_ON_CPU)
    if others:
        return False, f"off (auto): {_CPU_RULE}; this model has {', '.join(others)} layers"
    return True, f"on (auto): the whole step of a model of Dense layers ({_CPU_RULE})"


MOST_STEPS_PER_XLA_CALL = 10  # the most `auto` takes (more steps a call saved no more in the benchmarks)
_PER_CALL_RULE = "each call's fixed cost saved, a large part of a small dense step (README, Performance)"


def steps_per_xla_call(cfg, gpus: Optional[bool] = None) -> Tuple[Optional[int], str]:
    """(steps per XLA call, why) for the config (what --plan says)."""
    return decide_steps_per_xla_call(cfg.trainer.get("steps_per_xla_call", "auto"), jit_compile(cfg, gpus)[0], _facts(cfg),
                                     cfg.trainer.steps_per_loop, loop_periods(cfg.trainer, cfg.checkpoint), gpus)


def loop_periods(trainer, checkpoint) -> Tuple[int, int, int]:
    """The loop's periods besides steps_per_loop (0: none): logging, evaluation, checkpoints;
    of a config or a RunSpec, whose trainer and checkpoint keys are the same."""
    return trainer.log_every, trainer.eval_every, checkpoint.every_steps


def decide_steps_per_xla_call(asked, jit: Optional[bool], facts: strategies.Strategy, steps_per_loop: int, every: Iterable[int] = (),
                              gpus: Optional[bool] = None, layers: Optional[Iterable[str]] = None) -> Tuple[Optional[int], str]:
    """(consecutive steps in one XLA computation, why) for `trainer.steps_per_xla_call` = `asked`,
    once `decide_jit` has said `jit`. `every`: the loop's other periods (logging, evaluation,
    checkpoints; 0: none). At most `steps_per_loop`. `auto` takes the most steps, up to
    MOST_STEPS_PER_XLA_CALL, that divide all of them: every call of the loop is then whole calls
    of K steps, and the computation of a single step, for the steps left over, is never compiled."""
    if jit is False or not facts.xla_whole_step:
        return 1, "1 (XLA does not compile the whole step here)"
    if asked != "auto":
        steps = min(int(asked), steps_per_loop)
        capped = f", capped by trainer.steps_per_loop={steps_per_loop}" if steps < int(asked) else ""
        return (steps if jit else None), f"{steps} (trainer.steps_per_xla_call={asked}{capped})"
    if gpus:
        return 1, "1 (auto): with GPUs (the saving is shown on CPUs: README, Performance)"
    periods = [steps_per_loop, *(n for n in every if n)]
    steps = max(k for k in range(1, MOST_STEPS_PER_XLA_CALL + 1) if all(n % k == 0 for n in periods))
    if gpus is None or layers is None:
        return None, (f"auto: {steps} for the whole step of a model of Dense layers on CPUs ({_PER_CALL_RULE}; the most, up to "
                      f"{MOST_STEPS_PER_XLA_CALL}, that divide the steps per loop, log, eval and checkpoint), else 1")
    if set(layers) - FASTER_UNDER_XLA_ON_CPU:
        return 1, "1 (auto): a model beyond Dense layers: its step is long beside a call's cost"
    return steps, (f"{steps} (auto): a dense model's whole step on CPUs ({_PER_CALL_RULE}; the most, up to {MOST_STEPS_PER_XLA_CALL}, "
                   "that divide the steps per loop, log, eval and checkpoint)")


def precision_warning(precision: str, gpus: bool) -> Optional[str]:
    if precision == "mixed_float16" and not gpus:
        return ("trainer.precision=mixed_float16 without GPUs: CPUs emulate float16 arithmetic, many times slower than float32 "
                "(README, Performance; mixed_bfloat16 is the CPU's and TPU's half precision)")
    return None


def problems(cfg) -> List[Problem]:
    """Combinations of strategy, precision and XLA that cannot work."""
    if cfg.strategy.get("name") not in strategies.NAMES:
        return []  # named by the strategy check
    facts, trainer, found = _facts(cfg), cfg.trainer, []
    if trainer.jit_compile is True and facts.no_xla:
        found.append(Problem("trainer.jit_compile", True, f"strategy={facts.name} cannot use XLA: {facts.no_xla}; use false or auto"))
    per_call = trainer.get("steps_per_xla_call", "auto")
    if isinstance(per_call, int) and per_call > 1 and (trainer.jit_compile is False or not facts.xla_whole_step):
        found.append(Problem("trainer.steps_per_xla_call", per_call,
                             "more than 1 only where XLA compiles the whole step: strategy=one_device, trainer.jit_compile true or auto"))
    if trainer.precision in PRECISIONS and trainer.precision not in facts.precisions:
        found.append(Problem("trainer.precision", trainer.precision,
                             f"strategy={facts.name} runs {', '.join(facts.precisions)} (TPUs compute in bfloat16)"))
    return found


def _facts(cfg) -> strategies.Strategy:
    return strategies.get(cfg.strategy.name, cfg.cluster.workers, cfg.cluster.devices_per_worker)

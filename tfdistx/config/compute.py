"""How a step computes: XLA and precision, decided without TensorFlow.

Validation refuses what cannot work before TensorFlow starts, `--plan` says
what `trainer.jit_compile=auto` will choose, and the engine asks the same
function once it knows whether there are GPUs and what layers the model has
(engine/build.py).

What `auto` chooses is measured, not hoped (TF 2.21, a 2-core Xeon with
avx512_bf16; README, Performance; 2026-11-25, in-process, 3 alternating
rounds, medians, examples/s with XLA off / the whole step compiled):
- the seeds' 784-128-10 MLP at batch 128: 141k / 196k (1.39x);
- the 784-1024-1024-10 MLP at batch 1024: 15.8k / 18.5k (1.17x);
- ResNet-20 at batch 128: 479 / 169 (0.35x); the CNN: 4.6k / 1.7k (0.37x);
- wide_deep (embedding tables, sparse updates): 38k / 21k (0.54x);
- with the gradients alone compiled (mirrored, multiworker: the update runs
  outside XLA), the seeds' MLP 111k, slower than off.
XLA's CPU convolutions do not use oneDNN, and its sparse updates are
dense scatters; what it wins is fusing a dense model's many small kernels,
the optimizer's update most of all. So on CPUs `auto` compiles the whole
step (one_device) of a model whose weighted layers are all Dense, and
nothing else; with GPUs (what XLA is built for) it compiles.

`trainer.steps_per_xla_call`: compiled whole, K consecutive steps can be one
XLA computation (engine/update.py). A call costs ~100-150 us beyond its
arithmetic on these CPUs. Measured (2026-11-25, same machine, fresh
processes alternating, 10000 steps, median of 3; bench_vs_keras_fit.py):
the seeds' MLP 272k examples/s at K=1, 322k at K=10 (1.19x); single runs
of K=5, 10 and 20 were within noise of each other. The 1024-1024 MLP at
batch 1024: the same at K=1 and K=8. The weights are bitwise the same. So
`auto` takes up to 10 steps a call for the whole step of a model of Dense
layers on CPUs, and 1 elsewhere: a convolutional model's step is long
beside a call's cost, and with GPUs it is not measured. The K batches are
stacked (K batches more in memory).
"""

from typing import Iterable, List, Optional, Tuple

from tfdistx.config import strategies
from tfdistx.config.errors import Problem

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
JIT_COMPILE = (True, False, "auto")


# Layers (by class name) whose models XLA was measured to train faster on CPUs, compiled whole.
FASTER_UNDER_XLA_ON_CPU = frozenset({"Dense"})
_CPU_RULE = "on CPUs XLA pays only for a dense model's whole step: measured 1.39x on the seeds' MLP, 0.35x on ResNet-20"


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
        return None, (f"auto: on with GPUs; on CPUs on for a model of Dense layers only, else off ({_CPU_RULE}, "
                      "and 0.54x on wide_deep's embeddings)")
    others = sorted(set(layers) - FASTER_UNDER_XLA_ON_CPU)
    if others:
        return False, f"off (auto): {_CPU_RULE}; this model has {', '.join(others)} layers"
    return True, f"on (auto): the whole step of a model of Dense layers ({_CPU_RULE})"


MOST_STEPS_PER_XLA_CALL = 10  # the most `auto` takes (measured: K=5, 10 and 20 within noise of each other)
_PER_CALL_RULE = "measured 1.19x on the seeds' MLP"


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
        return 1, "1 (auto): not measured with GPUs"
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
        # Measured: the seeds' MLP on mirrored 1x2, 530 examples/s against 9,400 in float32.
        return ("trainer.precision=mixed_float16 without GPUs: CPUs emulate float16 arithmetic, about 18x slower than float32 "
                "(mixed_bfloat16 is the CPU's and TPU's half precision)")
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

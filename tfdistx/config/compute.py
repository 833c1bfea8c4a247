"""How a step computes: XLA and precision, decided without TensorFlow.

Validation refuses what cannot work before TensorFlow starts, `--plan` says
what `trainer.jit_compile=auto` will choose, and the engine asks the same
function once it knows whether there are GPUs (engine/build.py).

What `auto` chooses is measured, not hoped (TF 2.21, one device of a 2-core
Xeon with avx512_bf16; README, Performance). On CPUs XLA made every model
slower: the 784-1024-1024-10 MLP at batch 1024 0.91x (0.92x in
mixed_bfloat16), ResNet-20 0.70x, and, measured under load, the CNN 0.13x and
the seeds' 784-128-10 MLP 0.8x. XLA's CPU convolutions do not use oneDNN, and
its dense kernels are no faster than oneDNN's. So `auto` compiles with GPUs
(what XLA is built for) and not on CPUs.
"""

from typing import List, Optional, Tuple

from tfdistx.config import strategies
from tfdistx.config.errors import Problem

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
JIT_COMPILE = (True, False, "auto")


def jit_compile(cfg, gpus: Optional[bool] = None) -> Tuple[Optional[bool], str]:
    """(compile with XLA?, why) for the config's `trainer.jit_compile`."""
    return decide_jit(cfg.trainer.jit_compile, _facts(cfg), gpus)


def decide_jit(asked, facts: strategies.Strategy, gpus: Optional[bool] = None) -> Tuple[Optional[bool], str]:
    """(compile with XLA?, why) for `trainer.jit_compile` = `asked`; `gpus`:
    whether TensorFlow found GPUs (None: not known yet, and the answer may be None)."""
    if asked is False:
        return False, "off (trainer.jit_compile=false)"
    if facts.no_xla:  # only `auto` gets here: `true` is refused by problems()
        return False, f"off (auto): strategy={facts.name}: {facts.no_xla}"
    if asked is True:
        return True, "on (trainer.jit_compile=true)"
    if gpus is None:
        return None, "auto: on if TensorFlow finds GPUs, else off (on CPUs XLA was measured slower for every shipped model)"
    return (True, "on (auto): GPUs") if gpus else (False, "off (auto): on CPUs XLA was measured slower for every shipped model")


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
    if trainer.precision in PRECISIONS and trainer.precision not in facts.precisions:
        found.append(Problem("trainer.precision", trainer.precision,
                             f"strategy={facts.name} runs {', '.join(facts.precisions)} (TPUs compute in bfloat16)"))
    return found


def _facts(cfg) -> strategies.Strategy:
    return strategies.get(cfg.strategy.name, cfg.cluster.workers, cfg.cluster.devices_per_worker)

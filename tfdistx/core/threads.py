"""How many threads TensorFlow may use in each task of a local cluster,
decided without TensorFlow (`cluster.task_threads`).

TensorFlow sizes both of its thread pools in every process to all the
machine's cores: the intra-op pool, over which one op's work is split, and
the inter-op pool, which runs independent ops at once. A local cluster runs
all its tasks on one machine, so W workers on C cores bring 2 x W x C pool
threads to C cores, and a synchronous step waits for its slowest worker: a
worker whose threads were descheduled holds every other one up in the next
all-reduce. Sized to their share of the cores, the tasks no longer preempt
one another (docs/performance.md: more than one process, and
benchmarks/bench_multiworker_step.py, which sets both choices side by side).

`auto`: the cores this process may run on (its CPU affinity, which a
container's or Slurm's CPU binding narrows) divided among the tasks that run
steps (chief and workers), at least 1. N: N. That many threads split an
op's work (the intra-op pool); the inter-op pool gets as many but never
fewer than 2: with one, a parameter-server worker's step waits forever on a
variable read that needs a second thread (measured: ps1w2 hung at its first
step). 0: TensorFlow's own sizing (every core, in every task). Set through
TF_NUM_INTRAOP_THREADS and TF_NUM_INTEROP_THREADS, which TensorFlow reads
when it starts; a user's own values of those in the environment win.

Tasks sized so also keep their idle threads from spinning: TensorFlow's
pools spin a while before they sleep, which pays in a process that has the
cores to itself and costs where several processes share them (the spinning
thread takes the slice the thread with work needs). Measured on 2 cores,
the default MLP, 3,000 steps, alternating (docs/performance.md): 2x1
70.8-72.6k examples/s without spinning against 63.2-71.4k with; ps1w2
68.3/73.3k against 64.2/69.0k; one_device (not a task) 214.6/216.6k
against 225.7/232.8k, which is why only a local cluster's tasks turn it
off. The launcher says so with NO_SPINNING_ENV in the tasks' environment;
the engine turns it off before TensorFlow starts (engine/join.py).

Only the local launcher applies it: under TF_CONFIG, Slurm or Kubernetes
each task has its machine, container or CPU binding, and TensorFlow's own
sizing is the right one there.
"""

import os
from typing import Mapping, Optional, Tuple

from tfdistx.core.errors import Problem
from tfdistx.core.values import is_whole

AUTO = "auto"
ENV = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
NO_SPINNING_ENV = "TFDISTX_NO_THREAD_SPINNING"  # "1": the task's TensorFlow pools sleep when idle
STEP_JOBS = (
    "chief",
    "worker",
)  # the tasks that run training steps; ps, tf.data service and evaluator tasks mostly wait


def problem(setting) -> Optional[Problem]:
    if setting == AUTO or is_whole(setting) and setting >= 0:
        return None
    return Problem(
        "cluster.task_threads", setting, "allowed: auto, or a whole number of threads (0: TensorFlow's own, every core)"
    )


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def task_threads(
    setting, counts: Mapping[str, int], available: Optional[int] = None, environ: Mapping[str, str] = os.environ
) -> Tuple[Optional[int], str]:
    """(intra-op threads of each task, None for TensorFlow's own
    sizing; why) for a local cluster of `counts` tasks per job."""
    if any(name in environ for name in ENV):
        given = ", ".join(f"{name}={environ[name]}" for name in ENV if name in environ)
        return None, f"as the environment sets ({given})"
    if setting == 0:
        return None, "TensorFlow's own: every core, in every task (cluster.task_threads=0)"
    if setting != AUTO:
        return int(setting), f"cluster.task_threads={setting}"
    available = available or cores()
    stepping = sum(counts.get(job, 0) for job in STEP_JOBS) or 1
    threads = max(1, available // stepping)
    return threads, (
        f"{available} core(s) shared by {stepping} chief and worker task(s) "
        f"(cluster.task_threads=auto; 0 for TensorFlow's own, every core in every task)"
    )


MIN_INTER_OP = 2


def environment(threads: Optional[int]) -> dict:
    """What a task's environment gets for `threads` intra-op threads, its pools
    kept from spinning (nothing for TensorFlow's own sizing)."""
    if threads is None:
        return {}
    return {
        "TF_NUM_INTRAOP_THREADS": str(threads),
        "TF_NUM_INTEROP_THREADS": str(max(MIN_INTER_OP, threads)),
        NO_SPINNING_ENV: "1",
    }


def describe(threads: Optional[int]) -> str:
    if threads is None:
        return "as TensorFlow sizes them"
    env = environment(threads)
    return (
        f"{env['TF_NUM_INTRAOP_THREADS']} intra-op, {env['TF_NUM_INTEROP_THREADS']} inter-op, idle threads sleep (no "
        "spinning)"
    )

"""The sidecar evaluator's task (`cluster.evaluator=true`), as the launcher,
placement and the TFJob see it. What it does is engine/sidecar.py's.

TensorFlow defines the evaluator as a TF_CONFIG task of type "evaluator"
that is not part of the cluster spec: no worker, ps or coordinator waits
for it or talks to it. It only reads the run's checkpoints. So here:

- placement drops an `evaluator` job from any cluster spec (Kubeflow's
  operator lists it in every pod's TF_CONFIG), and places a process whose
  task is the evaluator outside the cluster;
- under Slurm it is one more task of the step, the last rank;
- the local launcher starts it beside the cluster's tasks with the same
  kind of TF_CONFIG, and watches it, but never restarts the cluster for it,
  never takes its exit code for the run's, and after the training tasks
  are done gives it time to evaluate the final checkpoint, then stops it.

No training code here.
"""

import time
from typing import Callable, Dict, List

EVALUATOR = "evaluator"  # TF_CONFIG's task type, and the TFJob's replica type in lower case
# What the evaluator does on SIGTERM (a pod deleted, the launcher's
# stop), as its notice says it: not a trainer's checkpoint.
EVALUATOR_ON_SIGTERM = "evaluating the newest checkpoint not yet evaluated, then stopping"
# After training has ended, how long the launcher waits for the evaluator to
# evaluate the final checkpoint before stopping it: it stops by itself as soon
# as it has, so this bounds only an evaluator that is stuck or very slow.
FINAL_EVALUATION_SECONDS = 300


def sidecar_jobs(evaluator: bool) -> Dict[str, int]:
    """Tasks the launcher starts beside the cluster (not in its spec): the evaluator, if the run has one."""
    return {EVALUATOR: 1} if evaluator else {}


def is_sidecar(job: str) -> bool:
    return job == EVALUATOR


def report_exit(task_name: str, code: int, say: Callable[[str], None]) -> None:
    """The one line a failed evaluator gets (`say`: the supervisor's): the run carries on without it."""
    say(
        f"the sidecar evaluator ({task_name}) exited with code {code}; training goes on without it "
        f"(its log: logs/{task_name.replace(':', '-')}.log)"
    )


def let_finish(
    procs: List, interrupted: Callable[[], bool], say: Callable[[str], None], seconds: float = FINAL_EVALUATION_SECONDS
) -> None:
    """Training has ended: give the evaluators `seconds` to evaluate the final
    checkpoint and exit by themselves (a signal from outside ends the wait)."""
    running = [p for p in procs if p.poll() is None]
    quiet_until = time.monotonic() + 2  # it usually has the final checkpoint already: nothing to say
    while any(p.poll() is None for p in running) and time.monotonic() < quiet_until and not interrupted():
        time.sleep(0.1)
    if not any(p.poll() is None for p in running) or interrupted():
        return
    say(f"training is done; waiting for the sidecar evaluator to evaluate the final checkpoint (at most {seconds:g}s)")
    deadline = time.monotonic() + seconds
    while any(p.poll() is None for p in running) and not interrupted():
        if time.monotonic() >= deadline:
            say(f"the sidecar evaluator did not finish within {seconds:g}s of the end of training: stopping it")
            return
        time.sleep(0.2)

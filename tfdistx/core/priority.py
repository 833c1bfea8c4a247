"""`cluster.nice`: a local cluster's priority, decided without TensorFlow.

Above 0, the local launcher's supervisor leaves the command's session for
one of its own and nices it and itself; the prefork, the tasks and the
sidecars it starts inherit both (cluster/processes.yield_the_cores). So a
training beside the user's other work (tests, a build) yields the cores to
it, and alone trains as fast. Only where tfdistx starts the processes: a
one-process run is started with `nice -n N`, and a scheduler's tasks
(TF_CONFIG, Slurm, a JobSet, agents) have its priority.
"""

from typing import List, Optional

from tfdistx.core.errors import Problem
from tfdistx.core.launch_mode import LaunchMode, Needs, Starter, refused
from tfdistx.core.values import is_whole

NICE_RANGE = range(0, 20)  # nice(2)'s: 19 yields the most; below 0 would need privileges


def problems(nice, multi_process: bool, launch: LaunchMode, strategy_name: str) -> List[Problem]:
    """What is wrong with cluster.nice for this strategy and launch ([] when nothing)."""
    if not is_whole(nice) or nice not in NICE_RANGE:
        return [
            Problem("cluster.nice", nice, "a whole number from 0 (as any program) to 19 (yield the cores the most)")
        ]
    if nice and not multi_process:
        return [
            Problem(
                "cluster.nice",
                nice,
                f"a local cluster's priority, and strategy={strategy_name} trains in this process: "
                f"start it so, `nice -n {nice} python -m tfdistx ...`",
            )
        ]
    return refused([needs(nice)], launch)


def needs(nice: int) -> Optional[Needs]:
    """A niced session is the local launcher's (None: not asked for): refused elsewhere (core/launch_mode.refused)
    rather than run at the scheduler's priority unsaid."""
    if not nice:
        return None
    return Needs(
        "cluster.nice",
        nice,
        "a local cluster's priority",
        (Starter.LAUNCHER,),
        "ask the scheduler (Slurm's --nice, a pod's priority), and leave cluster.nice=0 here",
    )


def plan_line(nice: int) -> str:
    """--plan's line of a niced local cluster."""
    return f"  priority    nice {nice}, in a session of its own: the cores go to this machine's other work first"

"""strategy.communication=mpi, decided without TensorFlow: where it runs,
and how a task is started so that it can join its peers.

MultiWorkerMirroredStrategy's collectives on CPUs are a ring over gRPC,
whose fixed cost is about 0.9 ms an all-reduce on one machine; MPI's
all-reduce between processes of one host goes through shared memory, and
called from the step it costs about 0.2 ms (docs/performance.md, measured
by benchmarks/bench_mpi_in_step.py). With `mpi`, the gradients' one
all-reduce of each step goes through MPI (engine/mpi.py); everything else
(variables' first values, the metrics' sum, checkpoints) stays on
TensorFlow's ring.

An MPI process needs MPI's own launcher: a process started alone cannot
connect to another (MPICH refuses two singletons: "Local and remote groups
in MPI_Intercomm must be disjoint"). So the local launcher starts each task
as `mpiexec -n 1 <its command>`: a world of one, which joins its peers
through a port name; the launcher gives the task's signals (SIGTERM,
SIGINT, SIGUSR1) to the task itself, not to mpiexec, which would say so in
lines of its own and loses one that comes before it has started the task
(cluster/processes.py); mpiexec ends with the task's exit code, and a task
whose mpiexec is killed dies with it (mpiexec's file of the machine's topology, /tmp/hydra_hwloc_xmlfile_*,
is removed when mpiexec ends by itself, not when it is killed: MPICH writes it
in /tmp whatever TMPDIR says). Only the local launcher does so: on Slurm, under TF_CONFIG,
agents or Kubernetes, the scheduler starts the tasks, so `mpi` is refused
there. MPICH and mpi4py install from PyPI as wheels: the `mpi` extra.
"""

import importlib.util
import os
import shutil
import sys
from typing import Any, List, Mapping, Optional, Sequence

from tfdistx.core.errors import Problem
from tfdistx.core.launch_mode import LaunchMode, Needs, Starter, refused

NAME = "mpi"
INSTALL = "pip install 'tfdistx[mpi]'"


def chosen(strategy_options: Mapping[str, Any]) -> bool:
    """Whether the run's strategy options ask for MPI (validation refuses them on any strategy but multiworker)."""
    return strategy_options.get("communication") == NAME


def needs(strategy_options: Mapping[str, Any]) -> Optional[Needs]:
    """MPI's tasks are started by the local launcher, each under mpiexec (None: not asked for): refused elsewhere before
    TensorFlow starts (core/launch_mode.refused), rather than at the join (engine/mpi.py)."""
    if not chosen(strategy_options):
        return None
    return Needs(
        "strategy.communication",
        NAME,
        "MPI's communication",
        (Starter.LAUNCHER,),
        "use strategy.communication=ring there",
    )


def mpiexec() -> Optional[str]:
    """MPI's launcher: beside this Python first (the `mpich` wheel installs it in the venv), else on PATH."""
    return shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")


def task_command(command: Sequence[str]) -> List[str]:
    """`command` started as a world of one of MPI's, which can join its peers (engine/mpi.py)."""
    return [mpiexec() or "mpiexec", "-n", "1", *command]


def problems(
    launch: LaunchMode, devices_per_worker: Optional[int], all_reduce_dtype: Optional[str], elastic: bool = False
) -> List[Problem]:
    """Why strategy.communication=mpi cannot run so (nothing when it can)."""
    key = "strategy.communication"
    found = []
    if elastic:  # each round would form a new communicator; not built, nor tested
        found.append(
            Problem(
                key,
                NAME,
                "sums over a fixed set of workers, and cluster.workers asks for an elastic run: "
                "use strategy.communication=ring there",
            )
        )
    elsewhere = refused([needs({"communication": NAME})], launch)
    if elsewhere:  # the one problem then: the rest is moot where MPI cannot run at all
        return elsewhere
    if devices_per_worker is not None and devices_per_worker != 1:
        found.append(
            Problem(
                key,
                NAME,
                f"sums one replica a worker, and cluster.devices_per_worker={devices_per_worker}: "
                "use cluster.devices_per_worker=1, or strategy.communication=ring",
            )
        )
    if all_reduce_dtype not in (None, "float32"):
        found.append(
            Problem(
                key, NAME, f"sums float32 gradients, not strategy.all_reduce_dtype={all_reduce_dtype}: leave it float32"
            )
        )
    if importlib.util.find_spec("mpi4py") is None or mpiexec() is None:
        found.append(Problem(key, NAME, f"needs MPI (mpi4py and an mpiexec): {INSTALL}"))
    return found

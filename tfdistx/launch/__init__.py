"""One room per way a run's processes start (`cluster.launch`, core/launch_mode.py):

    local/       tfdistx starts a cluster's processes on this machine (its launcher, an elastic host list)
    agent/       an agent on every node starts the node's worker in each round the agents agree on
    tf_config.py a task placed by TF_CONFIG (a Kubeflow TFJob, by hand)
    slurm/       a task of a Slurm step (and the batch script that starts the step)
    jobset.py    a pod of a Kubernetes JobSet (and its manifests, a TrainJob's too)
    kubernetes.py  what every pod of a manifest has (and the TFJob)

Each room's module (or package) named as its mode holds LAUNCH, a `Launch`
(base.py: detect, place, start, the scheduler's jobs, --plan's lines);
this module finds it there, so a new way is one module and one member of
LaunchMode. What every launch shares is cluster/'s (placement's data, the
supervisor, processes, prefork, liveness, the rendezvous of peers).

No TensorFlow here, and no training code.
"""

import importlib
import os
from typing import Dict, List, Mapping

from tfdistx.cluster.placement import Placement, check_topology
from tfdistx.launch.base import Job, Launch
from tfdistx.core import elastic, mpi, priority
from tfdistx.core.errors import Problem
from tfdistx.core.launch_mode import LaunchMode, Needs, refused
from tfdistx.core.run_spec import Layout


def of(mode: LaunchMode) -> Launch:
    """The launch of `mode`: LAUNCH in tfdistx/launch/<its value>."""
    return importlib.import_module(f"{__name__}.{LaunchMode(mode).value}").LAUNCH


def every() -> List[Launch]:
    """Every launch (`auto` is a choice among them, not one)."""
    return [of(mode) for mode in LaunchMode if mode is not LaunchMode.AUTO]


def chosen_by_auto(env: Mapping[str, str]) -> LaunchMode:
    """cluster.launch=auto: the first launch, in their detect_order, whose environment this process has."""
    asked = sorted((launch for launch in every() if launch.detect_order is not None), key=lambda l: l.detect_order)
    return next(launch.mode for launch in asked if launch.detected(env))


def jobs() -> Dict[str, Job]:
    """`tfdistx job KIND`'s kinds: each launch's scheduler scripts and manifests."""
    return {job.kind: job for launch in every() for job in launch.jobs}


def detect(layout: Layout, env: Mapping[str, str] = os.environ, training: bool = True) -> Placement:
    """How this process learns its place; `cluster.launch` forces the choice.
    A training run's tf.data service (`training`; an evaluation reads its own
    data) adds its tasks: with them a one-process strategy's trainer is the
    one `worker` task of a cluster that holds the service too."""
    service_jobs = layout.service_jobs() if training else {}
    if not layout.strategy.row.multi_process and not service_jobs:
        return Placement()
    mode = layout.cluster.launch
    launch = of(chosen_by_auto(env) if mode is LaunchMode.AUTO else mode)
    placement = launch.place(layout, env, training)
    if not placement.in_cluster:
        return placement
    check_topology(placement, {**layout.training_jobs(), **service_jobs}, launch.placed_where)
    if not layout.strategy.row.multi_process and placement.task_type not in placement.service:
        # the trainer: one process, fed by the service (its GPUs, with `job slurm --gpus`, as placed)
        return Placement(service=placement.service, gpus=placement.gpus)
    return placement


def needs(layout: Layout) -> List[Needs]:
    """What the run asks for that only tfdistx's own start of its processes gives (each feature says it)."""
    cluster = layout.cluster
    return [elastic.needs(cluster), priority.needs(cluster.nice), mpi.needs(layout.strategy.options)]


def refused_in_a_placed_task(layout: Layout, launched_by_tfdistx: bool = False) -> List[Problem]:
    """What a task a scheduler placed refuses at its start, though its config composed (under cluster.launch=auto,
    which only the local launcher's tasks may run so): the one list, read by such a task (commands/execute.py) and
    by every `tfdistx job`, whose tasks will be such tasks. `launched_by_tfdistx`: a task of tfdistx's own launcher
    or agent, which started it as each of these needs."""
    return [] if launched_by_tfdistx else refused(needs(layout), layout.cluster.launch, placed_by_a_scheduler=True)

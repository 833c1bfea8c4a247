"""The first of a run's phases (engine/fit.py): join the cluster.

A process placed in a cluster (TF_CONFIG, a Slurm step, the local
launcher's tasks) says where it stands in the one variable TensorFlow's
cluster resolvers read, shapes its devices before TensorFlow starts them,
and meets its peers by plain TCP before TensorFlow would wait for a
missing one forever (cluster/rendezvous.py). A task that only serves (a
parameter-server cluster's ps and workers) serves here until it is stopped,
and has nothing more to do.
"""

import enum
import os

from tfdistx.cluster.placement import Placement
from tfdistx.cluster.rendezvous import meet_peers
from tfdistx.core.run_spec import Cluster
from tfdistx.core.strategies import StrategyRow
from tfdistx.engine import strategy as strategy_lib
from tfdistx.engine.serving import serve_strategy_task
from tfdistx.internals import tensorflow as internals
from tfdistx.sigterm import SigtermNotice
from tfdistx.core import threads


class Joined(enum.Enum):
    """What this process does, having joined its cluster."""

    TO_TRAIN = "to train"  # it goes on to build the run and train (or evaluate)
    SERVED = "served"  # a task that lent its devices to the coordinator until it was stopped: nothing more to do


def join_cluster(cluster: Cluster, row: StrategyRow, placement: Placement, notice: SigtermNotice) -> Joined:
    """Join the cluster `cluster` describes under the configured strategy (`row`: its row in core/strategies.py)."""
    in_cluster = placement.in_cluster
    if in_cluster:
        # What TensorFlow's cluster resolvers (and its preemption handler) read.
        os.environ["TF_CONFIG"] = placement.tf_config()
    if os.environ.get(threads.NO_SPINNING_ENV) == "1":  # a local cluster's task, sharing the cores (core/threads.py)
        internals.disable_thread_spinning()  # before TF starts its devices
    strategy_lib.configure_devices(cluster.devices_per_worker, multi_worker=in_cluster)  # before TF starts its devices
    if in_cluster:  # TensorFlow would wait for a missing task forever (rendezvous.py)
        meet_peers(placement, cluster.startup_timeout, wait=placement.task_type not in row.serving_jobs, notice=notice)
        if row.asynchronous and placement.task_type not in row.serving_jobs:
            # A parameter-server coordinator given the notice before it formed the cluster leaves now: no task waits
            # for it inside TensorFlow, and its servers, given the notice too, stop serving a coordinator that is
            # not there yet (engine/serving.py), which it would then wait for, for ever, in forming the cluster.
            notice.leave_if_received("while the cluster was forming")
    if placement.task_type in row.serving_jobs:  # the coordinator drives training; this task lends its devices
        serve_strategy_task(placement, row, cluster, notice)
        return Joined.SERVED
    return Joined.TO_TRAIN

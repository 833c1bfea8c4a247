"""The first of a run's phases (engine/fit.py): join the cluster.

A process placed in a cluster (TF_CONFIG, a Slurm step, the local
launcher's tasks) says where it stands in the one variable TensorFlow's
cluster resolvers read, shapes its devices before TensorFlow starts them,
and meets its peers by plain TCP before TensorFlow would wait for a
missing one forever (cluster/rendezvous.py). A task that only serves (a
parameter-server cluster's ps and workers) serves here until it is stopped,
and has nothing more to do.
"""

import os

from tfdistx.cluster.placement import Placement
from tfdistx.cluster.rendezvous import meet_peers
from tfdistx.config.spec import RunSpec
from tfdistx.engine import strategy as strategy_lib
from tfdistx.engine.serving import serve_strategy_task
from tfdistx.sigterm import SigtermNotice


def join_cluster(spec: RunSpec, placement: Placement, notice: SigtermNotice) -> bool:
    """Join; True when this process goes on to train or evaluate, False for a
    task that has served the coordinator until it was stopped."""
    in_cluster = placement.in_cluster
    if in_cluster:
        # What TensorFlow's cluster resolvers (and its preemption handler) read.
        os.environ["TF_CONFIG"] = placement.tf_config()
    strategy_lib.configure_devices(spec.cluster.devices_per_worker, multi_worker=in_cluster)  # before TF starts its devices
    facts = spec.strategy.facts
    if in_cluster:  # TensorFlow would wait for a missing task forever (rendezvous.py)
        meet_peers(placement, spec.cluster.startup_timeout, wait=placement.task_type not in facts.serving_jobs, notice=notice)
    if placement.task_type in facts.serving_jobs:  # the coordinator drives training; this task lends its devices
        serve_strategy_task(placement, facts, spec.cluster.preemption_grace, notice)
        return False
    return True

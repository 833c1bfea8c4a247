"""Tasks that serve the trainers and train nothing themselves: a parameter-
server cluster's ps and worker tasks (TensorFlow servers the coordinator
runs its steps on and keeps its variables in) and the tf.data service's
dispatcher and data workers.

They run until they are stopped. A preemption reaches every task at once
(Kubernetes deletes every pod of a job, Slurm signals every task of a
step, the local launcher passes its SIGTERM on), and the trainers' answer
to it, a checkpoint at the next loop boundary, needs these servers: the
coordinator reads its variables from the ps tasks, the workers finish the
steps under way, trainers read their last batches from the service. So a
server given SIGTERM keeps serving until the trainers have left (their
servers stop answering: cluster/liveness.py), at most
`cluster.preemption_grace` seconds, and then exits with the preemption
code. A trainer of a one-process strategy (fed by the service) has no
server to ask: then the grace is waited out, or the launcher or scheduler
ends it first.
"""

import logging
import time
from typing import Dict

import tensorflow as tf

from tfdistx.cluster import liveness
from tfdistx.cluster.placement import Placement
from tfdistx.config.strategies import Strategy
from tfdistx.sigterm import SigtermNotice, leave_preempted, reclaim

log = logging.getLogger(__name__)


def serve_strategy_task(placement: Placement, facts: Strategy, grace: float, notice: SigtermNotice) -> None:
    """A parameter-server cluster's ps or worker task: TensorFlow's server
    for the coordinator to use (it lends its devices and holds variables)."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
                                  protocol=resolver.rpc_layer or "grpc", start=True)
    until_trainers_leave(server, placement, facts, grace, notice)


def until_trainers_leave(server, placement: Placement, facts: Strategy, grace: float, notice: SigtermNotice) -> None:
    """Let `server` serve (it runs in TensorFlow's threads; held here, as a
    collected server stops) until SIGTERM, then until the trainers have
    left; exits with the preemption code."""
    notice.plan = ""  # nothing to say unless the trainers outstay the grace
    reclaim()  # starting the server may have taken SIGTERM over
    while not notice.received.wait(0.5):  # a wait in Python, so that the signal handler runs
        pass
    trainers = trainer_addresses(placement, facts)
    deadline = time.monotonic() + grace
    if trainers:
        staying = liveness.wait_until_gone(trainers, deadline)
    else:
        time.sleep(max(deadline - time.monotonic(), 0))
        staying = ["the trainer"]
    if staying:
        log.warning("%s still running %gs after SIGTERM (cluster.preemption_grace): %s stops serving",
                    ", ".join(staying), grace, placement.task_name)
    leave_preempted()


def trainer_addresses(placement: Placement, facts: Strategy) -> Dict[str, str]:
    """The trainers this task serves, by name: the coordinator of a
    parameter-server cluster, every worker of a synchronous one; none for a
    one-process strategy, whose trainer runs no server to ask."""
    if not facts.multi_process:
        return {}
    jobs = ("chief",) if facts.asynchronous else ("chief", "worker")
    return {f"{job}:{index}": address for job in jobs for index, address in enumerate(placement.spec.get(job, []))}

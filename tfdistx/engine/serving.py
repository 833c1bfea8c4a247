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

Nothing may be there to stop a server whose trainers are gone: under
TF_CONFIG, Slurm or Kubernetes a coordinator that crashed or was cut off
leaves its ps and workers serving no one, holding their machines. So each
server watches the trainers it serves (cluster/liveness.py) and stops on
its own, exit 5, once one has not answered for `cluster.peer_timeout`
seconds (or never answered within `cluster.startup_timeout`: exit 4).
The chief tells the servers how the training ended before it leaves
(cluster/training_end.py): a server told 0 stops once its trainers have
left, with 0 (a job that trained to its end is not failed by its servers);
told another code, it stops at once with it.
"""

import logging
import time
from typing import Dict, List

import tensorflow as tf

from tfdistx.cluster import liveness, training_end
from tfdistx.cluster.placement import Placement
from tfdistx.engine.preemption import end_process_now, leave_now
from tfdistx.core.errors import EXIT_CLUSTER_DID_NOT_FORM, EXIT_LOST_PEER, EXIT_PREEMPTED, RunFault, offset_exit
from tfdistx.core.run_spec import Cluster
from tfdistx.core.strategies import StrategyRow
from tfdistx.sigterm import SigtermNotice, reclaim

log = logging.getLogger(__name__)


def serve_strategy_task(placement: Placement, row: StrategyRow, cluster: Cluster, notice: SigtermNotice) -> None:
    """A parameter-server cluster's ps or worker task: TensorFlow's server
    for the coordinator to use (it lends its devices and holds variables)."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    until_trainers_leave(server, placement, row, cluster, notice)


def until_trainers_leave(
    server, placement: Placement, row: StrategyRow, cluster: Cluster, notice: SigtermNotice
) -> None:
    """Let `server` serve (it runs in TensorFlow's threads; held here, as a
    collected server stops) until SIGTERM, then until the trainers have
    left; exits with the preemption code. A server whose trainers are gone
    or cut off stops on its own (exit 5), as they do without it: no one
    else may be there to stop it (TF_CONFIG, Slurm, Kubernetes). One the
    chief told how the training ended ends with it (_training_ended)."""
    notice.plan = ""  # nothing to say unless the trainers outstay the grace
    notice.saves = True  # a first Ctrl-C too: the trainers save at their next loop boundary, served by this task
    reclaim()  # starting the server may have taken SIGTERM over
    trainers = trainer_addresses(placement, row)
    lost: List[str] = []
    own = {**placement.cluster_spec, **placement.service}[placement.task_type][placement.task_index]
    # A trainer still starting has not answered yet: its silence counts from its first answer, or from startup_timeout.
    with (
        liveness.Watch(trainers, cluster.peer_timeout, lost.extend, unseen_timeout=cluster.startup_timeout) as watch,
        training_end.Hearing(own, training_end.cluster_digest(placement)) as chief,
    ):
        while not notice.received.wait(0.5):  # a wait in Python, so that the signal handler runs
            if (
                chief.code == EXIT_PREEMPTED
            ):  # the chief checkpointed (preempted alone): as if this server had the SIGTERM
                break
            if chief.code is not None:
                _training_ended(placement, chief.code, trainers, cluster)
            if lost:
                _stop_serving(placement, lost, watch.seen, cluster)
    deadline = time.monotonic() + cluster.preemption_grace
    if trainers:
        staying = liveness.wait_until_gone(trainers, deadline)
    else:
        time.sleep(max(deadline - time.monotonic(), 0))
        staying = ["the trainer"]
    if staying:
        log.warning(
            "%s still running %gs after %s (cluster.preemption_grace): %s stops serving",
            ", ".join(staying),
            cluster.preemption_grace,
            notice.signal_name,
            placement.task_name,
        )
    notice.leave()  # 42, or 130 after Ctrl-C


def _training_ended(placement: Placement, code: int, trainers: Dict[str, str], cluster: Cluster) -> None:
    """The chief said how the training ended (cluster/training_end.py).
    This server stops once the chief has left (and, the training done, its
    other trainers, done as well), at most `cluster.peer_timeout` later:
    never before it, so that a launcher watching both sees the chief's end
    first (a local cluster's parameter-server worker that left first would
    be restarted alone). With 0 it says nothing; with another code, one
    line, and that code. At once when it decides, as _stop_serving does
    (a server's own teardown can wait on a peer that has gone)."""
    waited = (
        trainers if code == 0 else {name: address for name, address in trainers.items() if name == _chief(placement)}
    )
    liveness.wait_until_gone(waited, time.monotonic() + cluster.peer_timeout)
    if code == 0:
        leave_now(0)
    end_process_now(
        RunFault(
            f"the training ended with exit code {code} (the chief said so): {placement.task_name} stops serving",
            offset_exit(code, cluster.retryable_exit_offset),
        )
    )


def _chief(placement: Placement) -> str:
    """The name of the task that trains and tells: the chief, or worker 0 of a cluster without one."""
    return "chief:0" if placement.cluster_spec.get("chief") else "worker:0"


def _stop_serving(placement: Placement, lost: List[str], seen: set, cluster: Cluster) -> None:
    """The trainers this server serves are gone or cut off: it stops, in one
    line and its code, at once. Nothing is left to save, and a server's own
    teardown can wait on a peer that is cut off (a tf.data service data
    worker on its dispatcher: measured, no end within 90 s)."""
    never = [name for name in lost if name not in seen]
    if never:
        fault = RunFault(
            f"{', '.join(never)} never answered within {cluster.startup_timeout:g}s (cluster.startup_timeout): "
            f"{placement.task_name} stops serving",
            offset_exit(EXIT_CLUSTER_DID_NOT_FORM, cluster.retryable_exit_offset),
        )
    else:
        fault = RunFault(
            f"lost contact with {', '.join(lost)}: no answer for {cluster.peer_timeout:g}s (cluster.peer_timeout); "
            f"{placement.task_name} stops serving",
            offset_exit(EXIT_LOST_PEER, cluster.retryable_exit_offset),
        )
    end_process_now(fault)


def trainer_addresses(placement: Placement, row: StrategyRow) -> Dict[str, str]:
    """The trainers this task serves, by name: the coordinator of a
    parameter-server cluster, every worker of a synchronous one; none for a
    one-process strategy, whose trainer runs no server to ask."""
    if not row.multi_process:
        return {}
    jobs = ("chief",) if row.asynchronous else ("chief", "worker")
    return {
        f"{job}:{index}": address for job in jobs for index, address in enumerate(placement.cluster_spec.get(job, []))
    }

"""data.service's processes and the trainers' view of them: a dispatcher
or data worker task runs its tf.data service server until it is stopped
(`serve`); a trainer reads the dispatcher's address from its placement
(`train_service`). The pipeline itself is built by data/service.py.
"""

import errno
import logging
import socket
from typing import Optional

import tensorflow as tf

from tfdistx.cluster import data_service as cluster_service
from tfdistx.cluster.placement import Placement
from tfdistx.core import data_service as config_service
from tfdistx.core.errors import EXIT_PORT_IN_USE, ConfigError, RunFault
from tfdistx.core.run_spec import Cluster, DataService
from tfdistx.core.strategies import StrategyRow
from tfdistx.data.service import Service
from tfdistx.engine.serving import until_trainers_leave
from tfdistx.sigterm import SigtermNotice

log = logging.getLogger(__name__)


def serve(placement: Placement, row: StrategyRow, cluster: Cluster, notice: SigtermNotice) -> None:
    """Run this task's tf.data service server (a dispatcher, or a worker
    that registers with the dispatcher) until the launcher or scheduler
    stops it, and after a SIGTERM until the trainers have saved and left
    (engine/serving.py). Like TensorFlow's own servers, it listens on every
    interface; a local cluster keeps it inside its private network namespace."""
    service = placement.service
    address = service[placement.task_type][placement.task_index]
    port = int(address.rpartition(":")[2])
    _check_port_free(port, placement.task_name, address)
    experimental = tf.data.experimental.service
    if placement.task_type == config_service.DISPATCHER:
        server = experimental.DispatchServer(experimental.DispatcherConfig(port=port))
        log.info("tf.data service dispatcher on %s", address)
    else:
        dispatcher = service[config_service.DISPATCHER][0]
        server = experimental.WorkerServer(
            experimental.WorkerConfig(dispatcher_address=dispatcher, worker_address=address, port=port)
        )
        log.info("tf.data service worker %s on %s, dispatcher %s", placement.task_name, address, dispatcher)
    until_trainers_leave(server, placement, row, cluster, notice)


def train_service(asked: Optional[DataService], placement: Placement, start_step: int) -> Optional[Service]:
    """What the training input needs to read from the service (None: off).
    The job name is shared by every trainer of the run (they all restored
    the same step), and new for a resumed run, which starts its own job."""
    if asked is None:
        return None
    address = cluster_service.dispatcher_address(placement.service)
    if address is None:  # validated configs place the service; a hand-written TF_CONFIG may not
        raise ConfigError.for_key(
            "data.service.workers",
            asked.workers,
            "this task's cluster (TF_CONFIG or the Slurm step) has "
            f"no `{config_service.DISPATCHER}` task: add the dispatcher and data workers (docs/multi-process.md: "
            "data.service)",
        )
    return Service(address=address, mode=asked.mode, job_name=f"tfdistx-train-from-step-{start_step}")


def _check_port_free(port: int, task: str, address: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            raise RunFault(
                f"TF_CONFIG={address!r}: task {task} cannot listen on port {port}: it is already in use on this host "
                f"(exit {EXIT_PORT_IN_USE}: a restart may find it free)",
                EXIT_PORT_IN_USE,
            ) from None

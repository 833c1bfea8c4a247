"""The tf.data service's tasks in a cluster spec (`data.service.workers`;
core/data_service.py has the config side).

A dispatcher and its data workers are placed like any task: the local
launcher starts them as tasks of the jobs `dispatcher` and `dataworker`,
a Slurm step gives them the ranks after the training tasks, and a TFJob's
`Dispatcher` and `DataWorker` replicas appear in TF_CONFIG under those
names. TensorFlow's strategies must not see them (a ClusterSpec job is a
TensorFlow server the strategy connects to, and a dispatcher is not one):
`split` takes them out of the spec the strategies get, and the trainers
find the dispatcher's address in what it took out. No TensorFlow here.
"""

from typing import Dict, List, Mapping, Optional, Tuple

from tfdistx.core.data_service import DISPATCHER, JOBS, WORKER  # noqa: F401 (re-exported for the launcher's side)


def split(spec: Mapping[str, List[str]]) -> Tuple[Dict[str, List[str]], Dict[str, List[str]]]:
    """(the spec TensorFlow sees, the service's jobs) of a cluster spec."""
    training = {job: list(addresses) for job, addresses in spec.items() if job not in JOBS}
    service = {job: list(addresses) for job, addresses in spec.items() if job in JOBS}
    return training, service


def dispatcher_address(service: Mapping[str, List[str]]) -> Optional[str]:
    """The dispatcher's gRPC target, as tf.data's `distribute(service=...)` takes it."""
    addresses = service.get(DISPATCHER) or []
    return f"grpc://{addresses[0]}" if addresses else None

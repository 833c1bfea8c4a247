"""The gradients' one all-reduce of each step through MPI
(strategy.communication=mpi: core/mpi.py says why and where).

Each task was started by the local launcher as `mpiexec -n 1 ...`: a world
of one. Once the strategy's cluster has formed, the tasks join one MPI
communicator: the first opens a port, whose name reaches the others
through the strategy's own collective (no file, no address to agree on),
and each connects to it; the communicator's ranks are the tasks' order
(chief, then workers), as TensorFlow's. In the step, the gradients are
concatenated, summed by one `Allreduce` in a host call
(`tf.numpy_function`), and split again: what mpi4py, a well-kept binding,
does with MPI's own collective; nothing here sums by hand.

The sum is MPI's, in its own order: a run trains the same as under
`ring` to rounding, not bitwise (an MPI run resumed ends bitwise equal to
an MPI run that never stopped). A peer lost in the middle of an
`Allreduce` may leave the survivors waiting in it: the launcher's teardown
stops them (SIGKILL after its grace), and its restart or its end follows,
as for any lost task.
"""

import os
from typing import Callable, List, Sequence

import numpy as np
import tensorflow as tf

from tfdistx.core import mpi as mpi_facts
from tfdistx.core.errors import ConfigError

PORT_BYTES = 1024  # MPI_MAX_PORT_NAME: MPICH's and Open MPI's
STARTED_BY_MPI = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")  # what MPI's launchers set in a process they start


class MpiSum:
    """Sums a replica's tensors over every task of the communicator, as
    ReplicaContext.all_reduce(SUM, tensors) does over the strategy's replicas."""

    def __init__(self, comm):
        self.comm = comm

    def __call__(self, tensors: Sequence[tf.Tensor]) -> List[tf.Tensor]:
        dense = [tf.convert_to_tensor(t) for t in tensors]  # an embedding's IndexedSlices summed as its dense gradient
        dtypes = {t.dtype for t in dense}
        if len(dtypes) != 1:
            raise ValueError(
                "strategy.communication=mpi sums gradients of one dtype, and these are "
                f"{sorted(d.name for d in dtypes)}"
            )
        flat = tf.concat([tf.reshape(t, [-1]) for t in dense], 0)
        summed = tf.numpy_function(self._sum, [flat], flat.dtype, stateful=True)
        summed.set_shape(flat.shape)
        parts = tf.split(summed, [int(np.prod(t.shape)) for t in dense])
        return [tf.reshape(part, t.shape) for part, t in zip(parts, dense)]

    def _sum(self, flat: np.ndarray) -> np.ndarray:
        out = np.empty_like(flat)
        self.comm.Allreduce(flat, out)
        return out


def join(strategy: tf.distribute.Strategy) -> MpiSum:
    """This task's MPI communicator with its peers', for a multiworker
    strategy whose cluster has formed; every task calls it at the same point."""
    if not any(name in os.environ for name in STARTED_BY_MPI):
        raise ConfigError.for_key(
            "strategy.communication",
            mpi_facts.NAME,
            "this task was not started by MPI's launcher, and only tfdistx's local launcher starts tasks so "
            "(cluster.launch=local): use strategy.communication=ring",
        )
    from mpi4py import MPI  # only here: a run without mpi never needs it installed

    resolver = strategy.cluster_resolver
    cluster = resolver.cluster_spec()
    tasks = [
        (job, index) for job in ("chief", "worker") if job in cluster.jobs for index in range(cluster.num_tasks(job))
    ]
    rank = tasks.index((resolver.task_type, resolver.task_id))
    port = MPI.Open_port() if rank == 0 else ""
    port = _from_the_first(strategy, port)
    # One task joins at a time, in the tasks' order: the others wait on the strategy's collective meanwhile. Tasks that
    # connected at once crashed MPICH 5.0.2 inside the group's Accept (measured: 4 workers, a segfault, every run).
    comm, barrier = MPI.COMM_WORLD, _barrier(strategy)
    for joiner in range(1, len(tasks)):
        if rank < joiner:
            comm = comm.Accept(port, root=0).Merge(high=False)
        elif rank == joiner:
            comm = MPI.COMM_WORLD.Connect(port).Merge(high=True)
        barrier()
    if rank == 0:
        MPI.Close_port(port)
    return MpiSum(comm.Split(0, rank))  # ranks in the tasks' order


def _summed_over_replicas(strategy: tf.distribute.Strategy, value) -> Callable[[], np.ndarray]:
    """A call that returns, on every task, `value` summed over the strategy's replicas
    (each task's own `value`): it returns once every task has made it."""

    @tf.function(autograph=False)
    def summed():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, value))

    return lambda: strategy.experimental_local_results(summed())[0].numpy()


def _barrier(strategy: tf.distribute.Strategy):
    """A call that returns on a task once every task has made it: a sum of nothing."""
    return _summed_over_replicas(strategy, tf.zeros([1]))


def _from_the_first(strategy: tf.distribute.Strategy, text: str) -> str:
    """The first task's `text`, on every task: a sum over the strategy's
    replicas in which only the first adds anything."""
    raw = np.frombuffer(text.encode(), np.uint8)
    codes = np.zeros(PORT_BYTES, np.int32)
    codes[: raw.size] = raw
    summed = _summed_over_replicas(strategy, tf.constant(codes))()
    return bytes(summed[summed > 0].astype(np.uint8)).decode()

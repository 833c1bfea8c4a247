"""An MPI all-reduce between processes of this machine, beside which to set
TensorFlow's collective (bench_multiworker_step.py: a ring over gRPC).

The same sizes as bench_multiworker_step.py's all-reduce alone (float32,
4 KB to 4 MB; 407 KB is the default MLP's gradients), one process per
rank, the least of three timed loops. Not a dependency of tfdistx: run it
in a venv of its own, where MPICH and mpi4py install from PyPI as wheels:

    python -m venv /tmp/mpi && /tmp/mpi/bin/pip install mpich mpi4py numpy
    /tmp/mpi/bin/mpiexec -n 2 /tmp/mpi/bin/python benchmarks/mpi_all_reduce.py
"""

import time

import numpy as np
from mpi4py import MPI

SIZES = [4_000, 400_000, 4_000_000]  # bytes of float32, as bench_multiworker_step.SIZES


def main() -> None:
    comm = MPI.COMM_WORLD
    for size in SIZES:
        send = np.ones(size // 4, np.float32)
        summed = np.empty_like(send)
        for _ in range(20):  # warm: buffers registered, shared memory mapped
            comm.Allreduce(send, summed, op=MPI.SUM)
        calls = max(20, 2000 * 400_000 // max(size, 400_000))
        best = float("inf")
        for _ in range(3):  # the least of three: this machine is shared
            comm.Barrier()
            started = time.perf_counter()
            for _ in range(calls):
                comm.Allreduce(send, summed, op=MPI.SUM)
            best = min(best, (time.perf_counter() - started) / calls * 1e3)
        if comm.rank == 0:
            print(f"{comm.size} processes, {size:>10,} bytes: {best:.3f} ms", flush=True)


if __name__ == "__main__":
    main()

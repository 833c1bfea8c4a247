"""cluster.launch=local: tfdistx starts a cluster's processes on this
machine, each a task placed by the TF_CONFIG its launcher gives it
(launcher.py), in rounds of the same tasks, or of a worker per listed host
(elastic.py, hosts.py). `auto` chooses it when no scheduler placed this
process. No TensorFlow here, and no training code: the command that starts
a task, and what it imports first, are handed in (`TaskStart`).
"""

import os
from typing import Dict, List, Mapping, Optional, Tuple

from tfdistx.cluster.launch_spec import LaunchSpec, Rounds, RoundsRecord
from tfdistx.cluster.placement import Placement
from tfdistx.launch.base import Launch, TaskStart, evaluator_line
from tfdistx.launch.local.launcher import run_local_cluster
from tfdistx.log_files import into_log_files
from tfdistx.sigterm import SigtermNotice
from tfdistx.core import mpi, priority, threads
from tfdistx.core.errors import ConfigError
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.core.run_spec import Layout, RunSpec


def local_tasks(layout: Layout, mode: str) -> Tuple[Dict[str, int], bool]:
    """The tasks a local launch starts (tasks per job, and whether a sidecar
    evaluator runs beside them), refused (ConfigError) when there are more
    processes than this machine can hold; --plan asks too."""
    # A one-process strategy launches here only to run beside its tf.data service: its trainer is the one worker.
    counts = {**layout.training_jobs(), **(layout.service_jobs() if mode == "train" else {})}
    evaluator = mode == "train" and layout.cluster.evaluator  # `tfdistx evaluate` needs no sidecar
    processes, most = sum(counts.values()) + evaluator, max(8, 4 * (os.cpu_count() or 1))
    if processes > most:  # each task is a whole TensorFlow process (docs/performance.md: peak RSS per task)
        raise ConfigError.for_key(
            "cluster",
            layout.cluster.name,
            f"a local cluster of {processes} processes"
            f"{' (with the sidecar evaluator)' if evaluator else ''} on this machine's {os.cpu_count()} cores: "
            f"at most {most} here; a larger cluster runs under Slurm or Kubernetes",
        )
    return counts, evaluator


def rounds_of(spec: RunSpec, mode: str) -> Optional[Rounds]:
    """An elastic run's rounds (launch/local/elastic.py); None when the run is
    not elastic (an evaluation never is: it runs once)."""
    keys = spec.cluster.elastic
    if mode != "train" or keys is None:
        return None
    return Rounds(
        spec.cluster.rounds,
        RoundsRecord.of(spec.run_dir, spec.checkpoint.dir),
        hosts=keys.hosts,
        discover=keys.discover,
    )


class LocalLaunch(Launch):
    mode = LaunchMode.LOCAL
    detect_order = 1000  # last: no scheduler placed this process, so tfdistx starts the cluster here

    def detected(self, env: Mapping[str, str]) -> bool:
        return True

    def refuse(self, layout: Layout, mode: str) -> None:
        local_tasks(layout, mode)  # more processes than this machine holds

    def start(self, spec: RunSpec, task: TaskStart, notice: Optional[SigtermNotice]) -> int:
        """Every task runs the run spec written for it, in the same run directory; only the chief writes the
        run's files."""
        layout, cluster = spec.layout, spec.cluster
        counts, evaluator = local_tasks(layout, task.mode)
        under_mpi = mpi.chosen(spec.strategy.options)
        # each task a world of one of MPI's, which joins its peers (core/mpi.py); not forked from a prefork then
        command = mpi.task_command(task.command) if under_mpi else list(task.command)
        per_pool, why = threads.task_threads(cluster.task_threads, counts)  # an elastic run: sized for MAX workers
        into_log_files(f"tfdistx: each task's TensorFlow threads: {threads.describe(per_pool)}; {why}")  # not shown
        launch_spec = LaunchSpec.of(
            spec,
            command,
            task_env=threads.environment(per_pool),
            preload=task.preload if cluster.prefork and not under_mpi else (),
            evaluator=evaluator,
            counts=counts,
            nice=cluster.nice,
            rounds=rounds_of(spec, task.mode),
        )
        return run_local_cluster(launch_spec, isolate=cluster.isolate, notice=notice)

    def plan(self, layout: Layout, placement: Placement) -> List[str]:
        topo = layout.cluster
        counts = layout.strategy.row.job_counts(topo.workers, topo.ps)
        local_tasks(layout, "train")  # refused as the run would be: more processes than this machine holds
        lines = [
            "placement     local cluster launched by tfdistx: one process per task on free 127.0.0.1 ports,",
            "              in a private network namespace when the OS allows it (cluster.isolate)",
        ]
        for job, n in counts.items():
            for index in range(n):
                lines.append(f"  task        {job}:{index}  TF_CONFIG task {{'type': '{job}', 'index': {index}}}")
        per_pool, why = threads.task_threads(topo.task_threads, counts)
        lines.append(f"  threads     each task: {threads.describe(per_pool)}; {why}")
        if topo.nice:
            lines.append(priority.plan_line(topo.nice))
        if topo.evaluator:  # beside the cluster (cluster/evaluator.py)
            lines.append(evaluator_line(""))
        return lines


LAUNCH = LocalLaunch()

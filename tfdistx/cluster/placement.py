"""Where this process stands in a cluster: the data every launch gives
(tfdistx/launch/: TF_CONFIG, a JobSet's pod, a Slurm step, the local
launcher, an agent), and the checks every scheduler's placement shares.

No TensorFlow here: the plan view and the launcher use it before any
TensorFlow work starts. The result is always expressed as a TF_CONFIG
(cluster spec + this task), because that is what TensorFlow's own
TFConfigClusterResolver reads, whoever placed the process.
"""

import json
import re
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional

from tfdistx.cluster.evaluator import EVALUATOR
from tfdistx.core.errors import ConfigError, Problem
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.core.run_spec import Layout
from tfdistx.core.strategies import describe_jobs


@dataclass
class Placement:
    """A cluster spec and this process's task in it (None: not placed yet)."""

    launch: Optional[LaunchMode] = None  # who placed this process; None: a one-process run, in no cluster
    cluster_spec: Dict[str, List[str]] = field(default_factory=dict)  # TensorFlow's ClusterSpec, as a dict
    task_type: Optional[str] = None
    task_index: int = 0
    # data.service's dispatcher and data workers (cluster/data_service.py): not in `cluster_spec`, which TensorFlow sees
    service: Dict[str, List[str]] = field(default_factory=dict)
    gpus: Optional[str] = None  # CUDA_VISIBLE_DEVICES for this task ("": none); None: as the process has it
    # What gave this task its address, as a refusal of its port names it (`cluster.base_port`, under Slurm)
    address_from: str = "TF_CONFIG"

    def __post_init__(self):
        self.launch = None if self.launch is None else LaunchMode(self.launch)

    @property
    def in_cluster(self) -> bool:
        """One task of a multi-process cluster a scheduler placed (not one tfdistx starts)."""
        return self.launch is not None and self.launch.placed_by_a_scheduler

    @property
    def starts_processes(self) -> bool:
        """This process starts the run's processes (the local launcher, a node's agent): it trains in none of them."""
        return self.launch is not None and not self.launch.placed_by_a_scheduler

    @property
    def is_chief(self) -> bool:
        if self.task_type == EVALUATOR:  # the sidecar evaluator writes none of the chief's files
            return False
        if self.launch is LaunchMode.AGENT:  # the agent that keeps the rounds owns the run dir, once it knows it does
            return False
        if self.launch is None or self.task_type is None:
            return True
        if "chief" in self.cluster_spec:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    @property
    def task_name(self) -> str:
        return f"{self.task_type}:{self.task_index}" if self.task_type else "main"

    def tf_config(self) -> str:
        return json.dumps({"cluster": self.cluster_spec, "task": {"type": self.task_type, "index": self.task_index}})


def scheduled_tasks(layout: Layout, training: bool = True) -> Dict[str, int]:
    """The tasks a scheduler starts for this layout (a Slurm step's, a
    JobSet's), per job in rank order: the strategy's (chief, ps, workers),
    a training run's tf.data service (dispatcher, data workers), and a
    sidecar evaluator, a task of its own (cluster/evaluator.py), last.
    `tfdistx job slurm` asks Slurm for as many."""
    service = layout.service_jobs() if training else {}
    return {**layout.training_jobs(), **service, **({EVALUATOR: 1} if layout.cluster.evaluator else {})}


def check_topology(placement: Placement, wanted: Dict[str, int], where: str) -> None:
    """The cluster a scheduler gave (`where`, as a refusal names it: "the Slurm step") must be the one the config
    asks for."""
    jobs = {**placement.cluster_spec, **placement.service}  # the service's tasks are placed alike
    have = {job: len(addresses) for job, addresses in jobs.items()}
    want = {job: n for job, n in wanted.items() if n}
    if placement.launch is LaunchMode.TF_CONFIG and "chief" in have and "chief" not in want:
        # A TFJob may run worker 0 as a separate `chief` task: it trains too.
        have["worker"] = have.get("worker", 0) + have.pop("chief")
    if have != want:
        raise ConfigError(
            [
                Problem(
                    where, _describe(have), f"the config's cluster asks for {_describe(want)}: make cluster= match it"
                )
            ]
        )
    if placement.task_type == EVALUATOR:  # beside the cluster, not in its spec (cluster/evaluator.py)
        if placement.task_index != 0:
            raise ConfigError.for_key(
                "TF_CONFIG task", placement.task_name, "a cluster has at most one evaluator: evaluator:0"
            )
    elif placement.task_type not in jobs or not 0 <= placement.task_index < len(jobs[placement.task_type]):
        listed = ", ".join(f"{job}:0..{len(addresses) - 1}" for job, addresses in jobs.items())
        raise ConfigError.for_key(
            "TF_CONFIG task", placement.task_name, f"this task is not in the cluster spec ({listed})"
        )
    for job, addresses in jobs.items():
        for address in addresses:
            if (
                not re.fullmatch(r"[^\s:]+:\d{1,5}|\[[0-9a-fA-F:.]+\]:\d{1,5}", address)
                or not 0 < int(address.rpartition(":")[2]) < 65536
            ):
                raise ConfigError.for_key(
                    f"TF_CONFIG cluster.{job}", address, "every address must be host:port, with a port from 1 to 65535"
                )


def _describe(counts: Mapping[str, int]) -> str:
    return describe_jobs(counts) or "no tasks"

"""Where this process stands in a cluster: TF_CONFIG, a JobSet's pod, Slurm, or a local launch.

No TensorFlow here: the plan view and the launcher use it before any
TensorFlow work starts. The result is always expressed as a TF_CONFIG
(cluster spec + this task), because that is what TensorFlow's own
TFConfigClusterResolver reads, whoever placed the process.
"""

import json
import os
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Dict, List, Mapping, Optional

from tfdistx.cluster import data_service
from tfdistx.launch import jobset_placement as jobset
from tfdistx.cluster.evaluator import EVALUATOR
from tfdistx.spec import elastic, mpi, priority
from tfdistx.spec.errors import ConfigError, Problem
from tfdistx.spec.run_spec import Layout
from tfdistx.spec.strategies import describe_jobs


class Source(str, Enum):
    """Who placed this process (`cluster.launch` names the last four)."""

    SINGLE = "single"  # a one-process strategy: no cluster
    LOCAL = "local"  # tfdistx launches the cluster's processes on this machine
    TF_CONFIG = "tf_config"  # one task of a cluster a scheduler placed (Kubernetes, by hand)
    SLURM = "slurm"  # one task of a Slurm step
    JOBSET = "jobset"  # a pod of a Kubernetes JobSet (or a TrainJob): its labels place it (launch/jobset.py)
    AGENT = "agent"  # its node's agent, which starts the node's worker in each round (launch/agent/node.py)

    def __str__(self) -> str:  # the cluster.launch word in messages and --plan, not "Source.SLURM"
        return self.value


@dataclass
class Placement:
    """A cluster spec and this process's task in it (None: not placed yet)."""

    source: Source
    spec: Dict[str, List[str]] = field(default_factory=dict)
    task_type: Optional[str] = None
    task_index: int = 0
    # data.service's dispatcher and data workers (cluster/data_service.py): not in `spec`, which TensorFlow sees
    service: Dict[str, List[str]] = field(default_factory=dict)
    gpus: Optional[str] = None  # CUDA_VISIBLE_DEVICES for this task ("": none); None: as the process has it

    def __post_init__(self):
        self.source = Source(self.source)

    @property
    def in_cluster(self) -> bool:
        """One task of a multi-process cluster (placed, not launching one)."""
        return self.source in (Source.TF_CONFIG, Source.SLURM, Source.JOBSET)

    @property
    def is_chief(self) -> bool:
        if self.task_type == EVALUATOR:  # the sidecar evaluator writes none of the chief's files
            return False
        if self.source is Source.AGENT:  # the agent that keeps the rounds owns the run directory, once it knows it does
            return False
        if self.source is Source.SINGLE or self.task_type is None:
            return True
        if "chief" in self.spec:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    @property
    def task_name(self) -> str:
        return f"{self.task_type}:{self.task_index}" if self.task_type else "main"

    def tf_config(self) -> str:
        return json.dumps({"cluster": self.spec, "task": {"type": self.task_type, "index": self.task_index}})


def detect(layout: Layout, env: Mapping[str, str] = os.environ, training: bool = True) -> Placement:
    """How this process learns its place; `cluster.launch` forces the choice.
    A training run's tf.data service (`training`; an evaluation reads its own
    data) adds its tasks: with them a one-process strategy's trainer is the
    one `worker` task of a cluster that holds the service too."""
    strategy, cluster = layout.strategy.facts, layout.cluster
    service_jobs = layout.service_jobs() if training else {}
    if not strategy.multi_process and not service_jobs:
        return Placement(Source.SINGLE)
    counts = {**layout.training_jobs(), **service_jobs}
    mode = cluster.launch
    if mode == "auto":
        mode = (
            "tf_config"
            if env.get("TF_CONFIG")
            else "jobset"
            if jobset.in_jobset(env)
            else "slurm"
            if "SLURM_PROCID" in env
            else "local"
        )
    if mode == "local":
        return Placement(Source.LOCAL, spec={k: [""] * n for k, n in counts.items() if n})
    if mode == "agent":
        return Placement(Source.AGENT, spec={k: [""] * n for k, n in counts.items() if n})
    if mode == "tf_config":
        placement = from_tf_config(env.get("TF_CONFIG", ""))
    elif mode == "jobset":
        placement = Placement(Source.JOBSET, *jobset.place(env, scheduled_tasks(layout, training)))
    else:
        placement = from_slurm(
            env, scheduled_tasks(layout, training), cluster.base_port
        )  # the evaluator: the step's last rank
    check_topology(placement, counts)
    if not strategy.multi_process and placement.task_type not in placement.service:
        # the trainer: one process, fed by the service (its GPUs, with export slurm --gpus, as placed)
        return Placement(Source.SINGLE, service=placement.service, gpus=placement.gpus)
    return placement


def refused_in_a_placed_task(layout: Layout, launched_by_tfdistx: bool = False) -> List[Problem]:
    """What a task a scheduler placed refuses at its start, though its config composed (under cluster.launch=auto,
    which only the local launcher's tasks may run so): an elastic run, a niced one, MPI's communication. The one
    list, read by such a task (commands/execute.py) and by every export, whose tasks will be such tasks.
    `launched_by_tfdistx`: a task of tfdistx's own local launcher, which started it as each of these needs."""
    cluster = layout.cluster
    return [
        *elastic.placed_by_a_scheduler(cluster, launched_by_tfdistx),
        *priority.placed_by_a_scheduler(cluster.nice, launched_by_tfdistx),
        *mpi.placed_by_a_scheduler(layout.strategy.options, launched_by_tfdistx),
    ]


def scheduled_tasks(layout: Layout, training: bool = True) -> Dict[str, int]:
    """The tasks a scheduler starts for this layout (a Slurm step's, a
    JobSet's), per job in rank order: the strategy's (chief, ps, workers),
    a training run's tf.data service (dispatcher, data workers), and a
    sidecar evaluator, a task of its own (cluster/evaluator.py), last.
    `tfdistx export slurm` asks Slurm for as many."""
    service = layout.service_jobs() if training else {}
    return {**layout.training_jobs(), **service, **({EVALUATOR: 1} if layout.cluster.evaluator else {})}


def from_tf_config(raw: str) -> Placement:
    try:
        config = json.loads(raw)
        spec, service = data_service.split(
            {job: list(addresses) for job, addresses in config["cluster"].items() if addresses and job != EVALUATOR}
        )  # not part of the cluster (cluster/evaluator.py)
        task = config["task"]
        return Placement(Source.TF_CONFIG, spec, task["type"], int(task.get("index", 0)), service)
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigError.one(
            "TF_CONFIG", raw[:80], f"is not a TF_CONFIG with 'cluster' and 'task' ({error})"
        ) from None


def check_topology(placement: Placement, wanted: Dict[str, int]) -> None:
    """The cluster a scheduler gave must be the one the config asks for."""
    jobs = {**placement.spec, **placement.service}  # the service's tasks are placed alike
    have = {job: len(addresses) for job, addresses in jobs.items()}
    want = {job: n for job, n in wanted.items() if n}
    if placement.source is Source.TF_CONFIG and "chief" in have and "chief" not in want:
        # A TFJob may run worker 0 as a separate `chief` task: it trains too.
        have["worker"] = have.get("worker", 0) + have.pop("chief")
    if have != want:
        where = {Source.TF_CONFIG: "TF_CONFIG", Source.JOBSET: "the JobSet"}.get(placement.source, "the Slurm step")
        raise ConfigError(
            [
                Problem(
                    where, _describe(have), f"the config's cluster asks for {_describe(want)}: make cluster= match it"
                )
            ]
        )
    if placement.task_type == EVALUATOR:  # beside the cluster, not in its spec (cluster/evaluator.py)
        if placement.task_index != 0:
            raise ConfigError.one(
                "TF_CONFIG task", placement.task_name, "a cluster has at most one evaluator: evaluator:0"
            )
    elif placement.task_type not in jobs or not 0 <= placement.task_index < len(jobs[placement.task_type]):
        listed = ", ".join(f"{job}:0..{len(addresses) - 1}" for job, addresses in jobs.items())
        raise ConfigError.one("TF_CONFIG task", placement.task_name, f"this task is not in the cluster spec ({listed})")
    for job, addresses in jobs.items():
        for address in addresses:
            if (
                not re.fullmatch(r"[^\s:]+:\d{1,5}|\[[0-9a-fA-F:.]+\]:\d{1,5}", address)
                or not 0 < int(address.rpartition(":")[2]) < 65536
            ):
                raise ConfigError.one(
                    f"TF_CONFIG cluster.{job}", address, "every address must be host:port, with a port from 1 to 65535"
                )


# A Slurm step's ports: base_port + 64 x (job id mod 500) + the rank on the node (validate.py keeps the range under
# 65536), unless the step is told which are free on each node (SLURM_PORTS_ENV, by `tfdistx export slurm`'s script).
SLURM_PORTS_PER_JOB, SLURM_JOB_SLOTS = 64, 500
SLURM_PORT_RANGE = SLURM_PORTS_PER_JOB * SLURM_JOB_SLOTS
# Set by `tfdistx export slurm`'s script: a line per node, "NODE PORT PORT ...", its tasks' ports in rank order
# (launch/slurm/free_ports.py found them free on that node as the step started).
SLURM_PORTS_ENV = "TFDISTX_SLURM_PORTS"
# Set by `tfdistx export slurm --gpus`'s script: each worker task takes this many of its node's GPUs (Slurm shows every
# task of a node all of the node's GPUs), in rank order; the node's other tasks (chief, ps, evaluator, the tf.data
# service) none, as their pods get none in a TFJob or a JobSet.
GPUS_PER_WORKER_ENV = "TFDISTX_GPUS_PER_WORKER"


def slurm_first_port(base_port: int, job_id: str) -> int:
    """The port of a Slurm job's first task on each node: shifted per job, so that jobs sharing a node start apart."""
    return base_port + SLURM_PORTS_PER_JOB * (int(job_id) % SLURM_JOB_SLOTS)


def from_slurm(env: Mapping[str, str], counts: Dict[str, int], base_port: int) -> Placement:
    """Derive the cluster from a Slurm step (`srun -n N python -m tfdistx ...`).

    Tasks are laid out in Slurm's block order: the first tasks-per-node ranks
    on the first node, and so on; each listens on the port its node's line of
    SLURM_PORTS_ENV gives it (the exported script's: ports free on that node),
    else on base_port + its rank on the node, shifted by 64 ports per job id
    (modulo 500) so that jobs sharing a node (a sweep's, say) start apart.
    Ranks map to jobs in order: chief, ps, worker. With GPUS_PER_WORKER_ENV,
    the placement says which of its node's GPUs the task takes (`gpus`).
    """
    try:
        rank = int(env["SLURM_PROCID"])
        total = int(env.get("SLURM_STEP_NUM_TASKS") or env["SLURM_NTASKS"])
        per_node = expand_tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env["SLURM_TASKS_PER_NODE"])
        nodelist_key = "SLURM_STEP_NODELIST" if env.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
        nodelist = env[nodelist_key]
    except (KeyError, ValueError) as error:
        raise ConfigError.one(
            "cluster.launch", "slurm", f"this is not a Slurm step with the usual variables ({error})"
        ) from None
    try:
        nodes = expand_hostlist(nodelist)
    except ValueError:
        raise ConfigError.one(nodelist_key, nodelist, "is not a Slurm host list (e.g. node[01-03,7],gpu5)") from None
    if len(nodes) != len(per_node) or sum(per_node) != total:
        raise ConfigError.one(
            nodelist_key,
            nodelist,
            f"{len(nodes)} node(s) for tasks per node {per_node} and {total} task(s): the Slurm variables disagree",
        )
    job_id = env.get("SLURM_JOB_ID", "0")
    if not job_id.isdigit():
        raise ConfigError.one("SLURM_JOB_ID", job_id, "must be a number (Slurm's job id)")
    wanted = sum(counts.values())
    if total != wanted:
        raise ConfigError.one(
            "cluster",
            _describe(counts),
            f"the Slurm step has {total} task(s); the config needs {wanted}: srun -n {wanted}",
        )
    ports = _ports_per_node(env, nodes, per_node, slurm_first_port(base_port, job_id))
    addresses = [f"{node}:{port}" for node, n in zip(nodes, per_node) for port in ports[node][:n]]
    roles = [(job, index) for job, n in counts.items() for index in range(n)]
    spec: Dict[str, List[str]] = {}
    for (job, _), address in zip(roles, addresses):
        spec.setdefault(job, []).append(address)
    if not 0 <= rank < len(roles):
        raise ConfigError.one("SLURM_PROCID", rank, f"outside the {total} tasks of the step")
    job, index = roles[rank]
    spec.pop(EVALUATOR, None)  # its rank has an address it never listens on: no task of the cluster waits for it
    spec, service = data_service.split(spec)  # the service's ranks come last (spec/data_service.job_counts)
    placement = Placement(Source.SLURM, spec, job, index, service)
    if env.get(GPUS_PER_WORKER_ENV):
        placement.gpus = _gpus_of(env, roles, per_node, rank)
    return placement


def _ports_per_node(env: Mapping[str, str], nodes: List[str], per_node: List[int], first: int) -> Dict[str, List[int]]:
    """node -> its tasks' ports, in rank order: SLURM_PORTS_ENV's lines, else derived from `first`."""
    given = env.get(SLURM_PORTS_ENV)
    if given is None:
        return {node: [first + local for local in range(n)] for node, n in zip(nodes, per_node)}
    ports = {}
    for line in given.splitlines():
        node, *numbers = line.split()
        if not all(number.isdigit() and 0 < int(number) < 65536 for number in numbers):
            raise ConfigError.one(
                SLURM_PORTS_ENV, line, "a line per node: NODE PORT PORT ..., each port from 1 to 65535"
            )
        ports[node] = [int(number) for number in numbers]
    short = [node for node, n in zip(nodes, per_node) if len(ports.get(node, [])) < n]
    if short:
        raise ConfigError.one(
            SLURM_PORTS_ENV,
            given.replace("\n", "; "),
            f"has too few ports for node {short[0]}, which holds {per_node[nodes.index(short[0])]} task(s) of the step",
        )
    return ports


def _gpus_of(env: Mapping[str, str], roles: List[tuple], per_node: List[int], rank: int) -> str:
    """CUDA_VISIBLE_DEVICES for the task at `rank`: a worker's own GPUS_PER_WORKER_ENV of its node's (the j-th
    worker on its node takes the j-th of them), none for any other task."""
    per_worker = env[GPUS_PER_WORKER_ENV]
    if not per_worker.isdigit() or int(per_worker) < 1:
        raise ConfigError.one(GPUS_PER_WORKER_ENV, per_worker, "a whole number of GPUs, 1 or more")
    if roles[rank][0] != "worker":
        return ""
    start = 0
    for n in per_node:  # the first rank on this task's node
        if start + n > rank:
            break
        start += n
    nth = sum(1 for job, _ in roles[start:rank] if job == "worker")
    visible = env.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range((nth + 1) * int(per_worker))]
    mine = devices[nth * int(per_worker) : (nth + 1) * int(per_worker)]
    if len(mine) < int(per_worker):
        raise ConfigError.one(
            "CUDA_VISIBLE_DEVICES",
            visible,
            f"worker {roles[rank][1]} is worker {nth + 1} on its node and takes {per_worker} GPU(s) of them "
            f"({GPUS_PER_WORKER_ENV}): the node has fewer (export slurm --gpus)",
        )
    return ",".join(mine)


def expand_hostlist(hostlist: str) -> List[str]:
    """Slurm's compact host list: 'node[01-03,7],gpu5' -> node01 node02 node03 node7 gpu5."""
    hosts = []
    token = re.compile(r"([^,\[\]]+)\[(\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)\]|([^,\[\]]+)")
    position = 0
    while position < len(hostlist):
        m = token.match(hostlist, position)
        if not m or (m.end() < len(hostlist) and hostlist[m.end()] != ","):
            raise ValueError(f"host list {hostlist!r}")
        prefix, ranges, single = m.groups()
        position = m.end() + 1
        if single:
            hosts.append(single)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{i:0{len(lo)}d}")
    if not hosts or hostlist.endswith(","):
        raise ValueError(f"host list {hostlist!r}")
    return hosts


def expand_tasks_per_node(value: str) -> List[int]:
    """'2(x3),1' -> [2, 2, 2, 1]."""
    counts = []
    for part in value.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ValueError(f"tasks per node {value!r}")
        counts += [int(m[1])] * int(m[2] or 1)
    return counts


def _describe(counts: Mapping[str, int]) -> str:
    return describe_jobs(counts) or "no tasks"

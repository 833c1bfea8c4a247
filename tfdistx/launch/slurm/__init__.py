"""cluster.launch=slurm: one task of a Slurm step (`srun -n N python -m
tfdistx ...`), placed by the step's variables, and the step's batch script
(script.py: `tfdistx job slurm`), whose first step asks every node for
ports free on it (free_ports.py). No TensorFlow here.
"""

import re
from typing import Dict, List, Mapping

from tfdistx.cluster import data_service
from tfdistx.cluster.evaluator import EVALUATOR
from tfdistx.cluster.placement import Placement, scheduled_tasks
from tfdistx.launch.base import Job, Launch
from tfdistx.core.errors import ConfigError
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.core.run_spec import Layout
from tfdistx.core.strategies import describe_jobs


# A Slurm step's ports: base_port + 64 x (job id mod 500) + the rank on the node (validate.py keeps the range under
# 65536), unless the step is told which are free on each node (SLURM_PORTS_ENV, by `tfdistx job slurm`'s script).
SLURM_PORTS_PER_JOB, SLURM_JOB_SLOTS = 64, 500
SLURM_PORT_RANGE = SLURM_PORTS_PER_JOB * SLURM_JOB_SLOTS
# Set by `tfdistx job slurm`'s script: a line per node, "NODE PORT PORT ...", its tasks' ports in rank order
# (free_ports.py found them free on that node as the step started).
SLURM_PORTS_ENV = "TFDISTX_SLURM_PORTS"
# Set by `tfdistx job slurm --gpus`'s script: each worker task takes this many of its node's GPUs (Slurm shows every
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
        raise ConfigError.for_key(
            "cluster.launch", LaunchMode.SLURM, f"this is not a Slurm step with the usual variables ({error})"
        ) from None
    try:
        nodes = expand_hostlist(nodelist)
    except ValueError:
        raise ConfigError.for_key(
            nodelist_key, nodelist, "is not a Slurm host list (e.g. node[01-03,7],gpu5)"
        ) from None
    if len(nodes) != len(per_node) or sum(per_node) != total:
        raise ConfigError.for_key(
            nodelist_key,
            nodelist,
            f"{len(nodes)} node(s) for tasks per node {per_node} and {total} task(s): the Slurm variables disagree",
        )
    job_id = env.get("SLURM_JOB_ID", "0")
    if not job_id.isdigit():
        raise ConfigError.for_key("SLURM_JOB_ID", job_id, "must be a number (Slurm's job id)")
    wanted = sum(counts.values())
    if total != wanted:
        raise ConfigError.for_key(
            "cluster",
            describe_jobs(counts),
            f"the Slurm step has {total} task(s); the config needs {wanted}: srun -n {wanted}",
        )
    ports = _ports_per_node(env, nodes, per_node, slurm_first_port(base_port, job_id))
    addresses = [f"{node}:{port}" for node, n in zip(nodes, per_node) for port in ports[node][:n]]
    roles = [(job, index) for job, n in counts.items() for index in range(n)]
    cluster_spec: Dict[str, List[str]] = {}
    for (job, _), address in zip(roles, addresses):
        cluster_spec.setdefault(job, []).append(address)
    if not 0 <= rank < len(roles):
        raise ConfigError.for_key("SLURM_PROCID", rank, f"outside the {total} tasks of the step")
    job, index = roles[rank]
    cluster_spec.pop(
        EVALUATOR, None
    )  # its rank has an address it never listens on: no task of the cluster waits for it
    cluster_spec, service = data_service.split(
        cluster_spec
    )  # the service's ranks come last (core/data_service.job_counts)
    placement = Placement(LaunchMode.SLURM, cluster_spec, job, index, service, address_from="cluster.base_port")
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
            raise ConfigError.for_key(
                SLURM_PORTS_ENV, line, "a line per node: NODE PORT PORT ..., each port from 1 to 65535"
            )
        ports[node] = [int(number) for number in numbers]
    short = [node for node, n in zip(nodes, per_node) if len(ports.get(node, [])) < n]
    if short:
        raise ConfigError.for_key(
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
        raise ConfigError.for_key(GPUS_PER_WORKER_ENV, per_worker, "a whole number of GPUs, 1 or more")
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
        raise ConfigError.for_key(
            "CUDA_VISIBLE_DEVICES",
            visible,
            f"worker {roles[rank][1]} is worker {nth + 1} on its node and takes {per_worker} GPU(s) of them "
            f"({GPUS_PER_WORKER_ENV}): the node has fewer (job slurm --gpus)",
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


class SlurmLaunch(Launch):
    mode = LaunchMode.SLURM
    detect_order = 30
    placed_where = "the Slurm step"
    jobs = (
        Job(
            "slurm",
            "a Slurm batch script: one srun step, one Slurm task per TensorFlow task (or an agent per node), "
            "requeued to resume after a notice",
            "tfdistx.launch.slurm.script:main",
        ),
    )

    def detected(self, env: Mapping[str, str]) -> bool:
        return "SLURM_PROCID" in env

    def place(self, layout: Layout, env: Mapping[str, str], training: bool) -> Placement:
        # the evaluator: the step's last rank
        return from_slurm(env, scheduled_tasks(layout, training), layout.cluster.base_port)


LAUNCH = SlurmLaunch()

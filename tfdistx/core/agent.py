"""A run with an agent on every node (cluster.launch=agent), as config:
what it needs and what it cannot do yet (launch/agent/node.py runs it).

Every node runs the same command; each node's agent starts one worker, and
the agents meet at `cluster.agent.store`, host:port, kept by the agent on
that host, which also runs the servers of the run (a parameter-server
run's chief and ps tasks, the tf.data service's dispatcher and data workers,
`data.service.workers`, which no elastic run has) and the sidecar evaluator
(`cluster.evaluator=true`, refused for an elastic run as the local launcher's
elastic rounds refuse it). With `cluster.workers=MIN:MAX` the run is elastic
across the nodes; without, it trains on cluster.workers nodes and waits for a
lost one to come back (below_min_timeout).

No TensorFlow here.
"""

import ipaddress
import re
from typing import List, Optional

from tfdistx.core import strategies
from tfdistx.core.errors import Problem
from tfdistx.core.launch_mode import LaunchMode

AGENT_STRATEGIES = (
    "multiworker",
    "parameter_server",
)  # a worker per node; parameter servers' chief and ps on the store's node
_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def problems(cluster, strategy: Optional[str]) -> List[Problem]:
    """Why this run cannot have an agent on every node as asked; [] when it
    can, or does not ask. `cluster`: the cluster section; `strategy`: strategy.name."""
    agent = cluster.get("agent") or {}
    if cluster.launch != LaunchMode.AGENT:
        return []
    found = []
    store = agent.get("store")
    m = _HOST_PORT.match(store) if isinstance(store, str) else None
    if m is None or not 0 < int(m[2]) < 65536:
        found.append(
            Problem(
                "cluster.agent.store",
                store,
                "host:port of the rendezvous (a port from 1 to 65535), the same on every "
                "node; the agent on that host keeps the rounds",
            )
        )
    address = agent.get("address")
    if address is not None and not (isinstance(address, str) and _is_host(address)):
        found.append(
            Problem(
                "cluster.agent.address",
                address,
                "this node's host name or IP address, without a port; or null: the address it reaches the store from",
            )
        )
    token_file = agent.get("token_file")
    if token_file is not None and not (isinstance(token_file, str) and token_file.strip()):
        found.append(
            Problem(
                "cluster.agent.token_file",
                token_file,
                "a file holding the run's secret, the same on every node (a path: it is read on each node); "
                "or null: the run directory's logs/rendezvous.key, made by the first agent",
            )
        )
    name = strategy
    if (
        name in strategies.NAMES
        and strategies.get(name, cluster.workers, cluster.devices_per_worker).name not in AGENT_STRATEGIES
    ):
        found.append(
            Problem(
                "strategy",
                name,
                "an agent on every node runs one worker per node, of a multi-worker cluster: "
                "use strategy=multiworker or strategy=parameter_server",
            )
        )
    elastic = cluster.get("elastic") or {}
    for key in ("hosts", "discover"):
        if elastic.get(key) is not None:
            found.append(
                Problem(
                    f"cluster.elastic.{key}",
                    elastic.get(key),
                    "with cluster.launch=agent the nodes are the agents that reach the rendezvous: leave it null",
                )
            )
    return found


def _is_host(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return bool(
            re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*", text)
        )


def plan_line(cluster, servers) -> str:
    """--plan's line of a run with an agent on every node (`servers`:
    the tasks its keeper's node runs beside its worker, per job)."""
    agent, bounds = cluster.agent, cluster.rounds
    low = bounds.min
    grace = (
        f"a round waits {bounds.join_grace:g}s past {low} agents for {cluster.workers}, "
        if low < cluster.workers
        else ""
    )
    servers = f" and runs {strategies.describe_jobs(servers)}" if servers else ""
    secret = (
        f"cluster.agent.token_file={agent.token_file}"
        if agent.token_file is not None
        else "the run dir's logs/rendezvous.key, made by the first agent"
    )
    return (
        f"agents        one per node, {low}:{cluster.workers} workers, meeting at {agent.store} (its host's agent "
        f"keeps the rounds{servers}); {grace}a node silent {bounds.lost_bound:g}s is lost, and the run stops after "
        f"{bounds.below_min_timeout:g}s below {low} (exit 9); every beat proves the run's secret ({secret})"
    )

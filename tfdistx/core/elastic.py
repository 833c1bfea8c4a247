"""Elastic training, as config: `cluster.workers=MIN:MAX` and the
`cluster.elastic` keys, what cannot be elastic, and a round's own config.

An elastic run trains in rounds: each round is a cluster of as many workers
as hosts are listed (cluster.elastic.hosts or .discover), from MIN
(`cluster.elastic.min_workers`) to MAX (`cluster.workers`, the topology the
run asks for); the local launcher forms them (launch/local/elastic.py). Each
round resumes from the newest checkpoint on its own topology (the global
batch kept), so a round's worker count must keep the global batch whole.

No TensorFlow here.
"""

import dataclasses
import math
import os
import re
from types import MappingProxyType
from typing import List, Optional, Sequence, Tuple

from tfdistx.core import data_service, strategies
from tfdistx.core.errors import ConfigError, Problem
from tfdistx.core.launch_mode import LaunchMode, Needs, Starter, refused

# torchrun's --nnodes=MIN:MAX, written as Hydra's override of the cluster's workers: any value with one colon
# (not an interpolation, ${oc.env:N}, nor a sweep) is meant as one, and is refused in its own words unless it is.
_SHORTHAND = re.compile(r"^cluster\.workers=([^,${}()\[\]:]*):([^,${}()\[\]:]*)$")
_WHOLE = re.compile(r"^\d+$")
TIMEOUT_KEYS = ("join_grace", "lost_bound", "below_min_timeout")


def expand_shorthand(overrides: Sequence[str]) -> List[str]:
    """`cluster.workers=2:4` is `cluster.workers=4 cluster.elastic.min_workers=2`:
    cluster.workers stays an integer (the most workers, the topology every
    other part of tfdistx reads), and MIN is its own key. A MIN:MAX that is
    not one (`4:2`, `2:x`, `:4`) raises ConfigError naming what was typed,
    not the keys it would have become."""
    expanded = []
    for override in overrides:
        m = _SHORTHAND.match(override)
        if m is None:
            expanded.append(override)
            continue
        low, high = m[1].strip(), m[2].strip()
        if not (_WHOLE.match(low) and _WHOLE.match(high) and 1 <= int(low) <= int(high)):
            raise ConfigError.for_key(
                "cluster.workers",
                f"{m[1]}:{m[2]}",
                "MIN:MAX with MIN <= MAX, both whole numbers >= 1 (an elastic "
                "run of MIN to MAX workers), or one number of workers",
            )
        expanded += [f"cluster.workers={int(high)}", f"cluster.elastic.min_workers={int(low)}"]
    return expanded


def is_elastic(cluster) -> bool:
    """Of the cluster group as composed, or as resolved (core/run_spec.py: its `elastic` is None when fixed)."""
    return getattr(getattr(cluster, "elastic", None), "min_workers", None) is not None


def worker_range(cluster) -> Tuple[int, int]:
    """(MIN, MAX) workers of an elastic run."""
    return int(cluster.elastic.min_workers), int(cluster.workers)


def shown(cluster) -> str:
    low, high = worker_range(cluster)
    return f"{low}:{high}"


def problems(cluster, strategy: Optional[str], data, optimizer) -> List[Problem]:
    """Why this run cannot be elastic as asked; [] when it is not elastic. Each of the config's sections it
    reads: `cluster`, `data`, `optimizer`; `strategy`: strategy.name."""
    if not is_elastic(cluster):
        return []
    elastic, low = cluster.elastic, cluster.elastic.min_workers
    name = strategy
    found = []
    if not isinstance(low, int) or not 1 <= low <= cluster.workers:
        return [
            Problem(
                "cluster.elastic.min_workers",
                low,
                f"from 1 to cluster.workers={cluster.workers} (the most workers a round may have); "
                "or null: not elastic",
            )
        ]
    if name not in strategies.NAMES:
        return []  # refused by its own check
    row = strategies.get(name, cluster.workers, cluster.devices_per_worker)
    shown_range = f"cluster.workers={low}:{cluster.workers}"
    if not row.multi_process and cluster.workers > 1:
        return []  # refused as any one-process strategy on several workers is (validate.py), in its own line
    if not row.multi_process:
        return [
            Problem(
                "strategy",
                name,
                f"trains in one process, which cannot lose or gain a machine ({shown_range} is elastic): "
                "use strategy=multiworker, or leave cluster.elastic.min_workers=null",
            )
        ]
    if data_service.workers(data):
        found.append(
            Problem(
                "data.service.workers",
                data_service.workers(data),
                f"a tf.data service job cannot re-form its "
                f"trainers between rounds, nor resume exactly ({shown_range} is elastic): use data.service.workers=0",
            )
        )
    if cluster.get("evaluator"):
        found.append(
            Problem(
                "cluster.evaluator",
                True,
                f"the sidecar evaluator is not kept across an elastic run's rounds ({shown_range}): "
                "evaluate with trainer.eval_every, or `tfdistx evaluate` afterwards",
            )
        )
    elsewhere = refused([needs(cluster)], cluster.launch)
    if elsewhere:  # the one problem then: hosts and the rest are moot
        return elsewhere
    if cluster.launch != LaunchMode.AGENT:  # the agents that reach the rendezvous are the hosts (core/agent.py)
        found += _hosts(elastic)
    for key in TIMEOUT_KEYS:
        value = elastic[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            found.append(Problem(f"cluster.elastic.{key}", value, "seconds, more than 0"))
    if not row.asynchronous:
        found += _batch_on_every_round(data.get("batch_size"), cluster.devices_per_worker or 1, low, cluster.workers)
        if optimizer.get("scale_lr_with_replicas"):
            found.append(
                Problem(
                    "optimizer.scale_lr_with_replicas",
                    True,
                    f"an elastic run's rounds ({shown_range}) have other replica "
                    "counts, and the learning rate would change with each: use optimizer.scale_lr_with_replicas=false",
                )
            )
    return found


def _hosts(elastic) -> List[Problem]:
    hosts, discover = elastic.get("hosts"), elastic.get("discover")
    for key, value, what in (
        ("discover", discover, "a command printing the hosts, one a line"),
        ("hosts", hosts, "a file listing the hosts, one a line"),
    ):
        if value is not None and not isinstance(
            value, str
        ):  # `discover=false` is YAML's boolean, not a command named False
            return [Problem(f"cluster.elastic.{key}", value, f"{what} (a string), or null")]
    if hosts is None and discover is None:
        return [
            Problem(
                "cluster.elastic.hosts",
                None,
                "an elastic run needs its hosts: a file listing them one a line "
                "(cluster.elastic.hosts=FILE), or a command printing them (cluster.elastic.discover=COMMAND)",
            )
        ]
    if hosts is not None and discover is not None:
        return [
            Problem(
                "cluster.elastic.discover", discover, f"set with cluster.elastic.hosts={hosts}: name the hosts one way"
            )
        ]
    if hosts is not None and not os.path.isfile(str(hosts)):
        return [Problem("cluster.elastic.hosts", hosts, "no such file: a file listing the hosts, one a line")]
    if discover is not None and not str(discover).strip():
        return [Problem("cluster.elastic.discover", discover, "a command printing the hosts, one a line")]
    return []


def _batch_on_every_round(batch, devices: int, low: int, high: int) -> List[Problem]:
    """Every round keeps the global batch `batch` (engine/topology.py refuses a
    resume that does not): it must divide across every worker count's `devices` each."""
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        return []  # refused by its own check (validate._data: not a batch)
    counts = range(low, high + 1)
    whole = math.lcm(*(workers * devices for workers in counts))
    if batch % whole == 0:
        return []
    return [
        Problem(
            "data.batch_size",
            batch,
            f"an elastic run keeps its global batch on every round, split across "
            f"{', '.join(str(w * devices) for w in counts)} replicas: use a multiple of {whole}",
        )
    ]


def needs(cluster) -> Optional[Needs]:
    """Elastic rounds are formed by tfdistx's local launcher or its agents, not by a scheduler's fixed set of tasks
    (None: not elastic): refused there (core/launch_mode.refused) rather than trained on a fixed cluster of MAX
    workers unsaid."""
    if not is_elastic(cluster):
        return None
    return Needs(
        "cluster.workers",
        shown(cluster),
        "an elastic run",
        (Starter.LAUNCHER, Starter.AGENTS),
        "run an agent on every node (under Slurm and in a JobSet too), or the local launcher on one machine; or "
        f"give one number of workers, cluster.workers={cluster.workers}",
    )


def plan_line(cluster) -> Optional[str]:
    """--plan's line of an elastic run; None when it is not elastic."""
    if not is_elastic(cluster):
        return None
    elastic, bounds = cluster.elastic, cluster.rounds
    low, high = bounds.min, bounds.max
    source = f"listed in {elastic.hosts}" if elastic.hosts is not None else f"printed by `{elastic.discover}`"
    return (
        f"elastic       {low}:{high} workers, one per host {source}; a round waits {bounds.join_grace:g}s past {low} "
        f"hosts for {high}, a lost host {bounds.lost_bound:g}s to come back, and the run "
        f"{bounds.below_min_timeout:g}s below {low} (then exit 9)"
    )


def for_round(spec, workers: int):
    """A round's run spec (of a RunSpec, core/run_spec.py): `workers` workers, the rest of the run unchanged. Its
    cluster's name says the round's topology (`3x1`, in the log's `resuming on another topology` line and in
    summary.json), its strategy's row is the one for that many workers, and its resolved config says both, as the
    loggers record it."""
    cluster = spec.cluster
    name = f"ps{cluster.ps}w{workers}" if cluster.ps else f"{workers}x{cluster.devices_per_worker or 1}"
    row = strategies.get(spec.strategy.name, workers, cluster.devices_per_worker)
    config = {**spec.config, "cluster": {**spec.config["cluster"], "workers": workers, "name": name}}
    return dataclasses.replace(
        spec,
        cluster=dataclasses.replace(cluster, workers=workers, name=name),
        strategy=dataclasses.replace(spec.strategy, row=row),
        config=MappingProxyType(config),
    )

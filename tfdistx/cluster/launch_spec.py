"""What the supervisor of a run's processes is handed (cluster/supervisor.py),
by the local launcher (launch/local/) or a node's agent (launch/agent/):
one frozen record, made from the run spec by their `start`, JSON by
core/typed_json.py each way. No TensorFlow here, and no training code.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence, Tuple

from tfdistx.core.run_spec import Bounds, RunSpec  # Bounds: the run's, handed on as they are


@dataclass(frozen=True)
class RoundsRecord:
    """Where a run in rounds tells them (cluster/rounds.py): the rounds file, and what its lines read."""

    rounds_file: str
    checkpoint_dir: str
    metrics_file: str

    @classmethod
    def of(cls, run_dir: Path, checkpoint_dir: str) -> "RoundsRecord":
        """A run's, in its run dir `run_dir`, whose checkpoints are in `checkpoint_dir`."""
        return cls(str(run_dir / "logs" / "rounds.json"), checkpoint_dir, str(run_dir / "metrics.jsonl"))


@dataclass(frozen=True)
class Rounds:
    """A run that trains in rounds: an elastic local cluster's (a worker per listed host: `hosts` or `discover`), or
    the agents' (their rendezvous forms them)."""

    bounds: Bounds
    record: RoundsRecord
    hosts: Optional[str] = None  # a file listing the hosts, one a line; or
    discover: Optional[str] = None  # a command printing them


@dataclass(frozen=True)
class Rendezvous:
    """A node's agent's: where the agents meet, what they prove, and what the node that keeps the rounds runs."""

    store: str  # host:port of the rendezvous, kept by the agent on that host
    address: Optional[str]  # this node's; None: the one it reaches the store from
    token_file: Optional[str]  # the run's secret (launch/agent/run_secret.py); None: made in the run dir
    config: str  # the digest of the resolved config every task reads: the rendezvous admits that config only
    run_dir: str  # owned by the node that keeps the rounds
    servers: Mapping[str, int]  # the tasks that node runs beside its worker, per job
    keeper_task_env: Mapping[str, str]  # their environment (TensorFlow's threads sized for them all)
    config_record: Mapping[str, str]  # the run's .hydra/ files, which that node writes


@dataclass(frozen=True)
class LaunchSpec:
    """A run's processes as their supervisor starts and keeps them."""

    command: Tuple[str, ...]  # what starts one task (commands/task.py), placed by the TF_CONFIG it is given
    log_dir: str  # the tasks' logs and scratch
    run_log: Optional[str]  # the run's one log file: every task's lines, prefixed, and the supervisor's own
    primary: Tuple[str, ...]  # the jobs whose end is the run's end
    restart_alone: Tuple[str, ...] = ()  # the jobs whose tasks restart on their own
    max_restarts: int = 0  # cluster.max_restarts: restarts of a round or of a task alone, with back-off
    stopped_task_timeout: float = 60  # a task stopped (SIGSTOP) this long is killed, as lost
    preemption_grace: float = 60  # after a SIGTERM, the tasks' time to checkpoint
    peer_timeout: float = 60  # a chief whose peer was lost: its call's time to fail, before that grace
    notice_signals: Tuple[str, ...] = ()  # passed on as SIGTERM is (cluster.notice_signals: USR1 ...)
    task_env: Mapping[str, str] = field(default_factory=dict)  # added to every task's environment
    preload: Tuple[str, ...] = ()  # what every task imports first, once, in a prefork (cluster/prefork.py)
    preload_imported: bool = False  # the launcher had imported it: the prefork is a fork of it
    evaluator: bool = False  # a sidecar evaluator beside the cluster (cluster/evaluator.py)
    counts: Mapping[str, int] = field(default_factory=dict)  # the local launcher's tasks per job
    nice: int = 0  # above 0, the cluster's processes run at that lower priority (processes.yield_the_cores)
    rounds: Optional[Rounds] = None  # None: a fixed cluster, the same tasks every round
    agent: Optional[Rendezvous] = None  # None: the local launcher's

    @classmethod
    def of(cls, spec: RunSpec, command: Sequence[str], **more) -> "LaunchSpec":
        """The run's processes as `spec` has them kept (its cluster's restarts, grace, signals; its strategy's
        primary jobs and those restarted alone), each started by `command`, in the run dir; `more`: the launch's
        own (its tasks, their environment, its rounds)."""
        cluster, row = spec.cluster, spec.layout.strategy.row
        return cls(
            command=tuple(command),
            log_dir=str(spec.run_dir / "logs"),
            run_log=str(spec.run_dir / "tfdistx.log"),
            primary=tuple(row.primary_jobs),
            restart_alone=tuple(row.restartable_alone),
            max_restarts=cluster.max_restarts,
            stopped_task_timeout=cluster.stopped_task_timeout,
            preemption_grace=cluster.preemption_grace,
            peer_timeout=cluster.peer_timeout,
            notice_signals=tuple(cluster.notice_signals),
            **more,
        )

"""Where a command meets the engine: train or evaluate in this process, or
as a local cluster of processes that each do it (cluster/launch.py).

The composed config is resolved into a RunSpec first thing here, the one
hand-over from the config side: placement, the local launcher and the
engine read the spec, never the config. TensorFlow is imported only on the
in-process path: a local cluster's launcher never starts it.
"""

import copy
import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from omegaconf import DictConfig, OmegaConf

from tfdistx import machine
from tfdistx.cluster import placement as cluster, training_end
from tfdistx.cluster.evaluator import EVALUATOR, EVALUATOR_ON_SIGTERM
from tfdistx.cluster.agent import run_agent
from tfdistx.cluster.launch import run_local_cluster
from tfdistx.cluster.rendezvous import LOCAL_CLUSTER_ENV
from tfdistx.commands.ending import hold_until_exit
from tfdistx.cluster.placement import Placement, Source
from tfdistx.spec import data_service, mpi, threads
from tfdistx.spec.errors import ConfigError, retryable_exits_offset_by
from tfdistx.spec.objective import value as objective_value
from tfdistx.config.resolve import resolve
from tfdistx.spec.run_spec import Layout, RunSpec
from tfdistx.log_files import into_log_files
from tfdistx.whole_files import write_json, write_whole
from tfdistx.sigterm import SigtermNotice


def execute(
    cfg: DictConfig,
    run_dir: str,
    mode: str,
    step: Optional[int] = None,
    process_ends_after: bool = False,
    notice: Optional[SigtermNotice] = None,
    placement: Optional[Placement] = None,
    config_record: Optional[dict] = None,
):
    """Train (mode "train") or evaluate (mode "evaluate") as `cfg` says, in
    `run_dir`. `notice`: the process's SIGTERM notice (sigterm.py), taken
    at its start; a training run without one takes it here. `placement`:
    where this process stands (placement_of), when the caller has it.
    `config_record`: the run's .hydra/ files, which an agent's node records
    if it keeps the rounds (commands/run.py).
    `process_ends_after`: the process ends as soon as this returns
    (cli.end_process), so what the run built is held until then."""
    if mode == "train" and notice is None:
        with SigtermNotice() as notice:
            return execute(cfg, run_dir, mode, step, process_ends_after, notice, placement, config_record)
    spec = resolve(cfg, run_dir)  # the one reader of the config: from here on, the spec
    layout, training = spec.layout, mode == "train"
    if notice is not None:  # taken with the default signals before the config was known: now the config's
        notice.listen(layout.cluster.notice_signals)
    placement = placement or placement_of(layout, mode)
    if placement.gpus is not None:  # its share of its node's GPUs (`export slurm --gpus`), before TensorFlow sees any
        os.environ["CUDA_VISIBLE_DEVICES"] = placement.gpus
    if (
        training and placement.is_chief and placement.source is not Source.LOCAL
    ):  # once: by the task that trains, not its launcher
        for warning in (
            layout.strategy.facts.stale_gradients_warning(layout.cluster.workers, spec.trainer.steps),
            data_service.mode_resume_warning(
                layout.service.mode if layout.service else None, spec.trainer.deterministic
            ),
        ):
            if warning:
                warn(warning)
    if placement.in_cluster:
        launched_by_tfdistx = bool(os.environ.get(LOCAL_CLUSTER_ENV))
        refused = cluster.refused_in_a_placed_task(layout, launched_by_tfdistx)
        if refused:
            raise ConfigError(refused)
    with retryable_exits_offset_by(layout.cluster.retryable_exit_offset):
        if placement.source is Source.LOCAL:
            return _run_local_cluster(spec, mode, step, notice)
        if placement.source is Source.AGENT:
            return _run_agent(spec, mode, notice, config_record)
        if (
            placement.task_type == EVALUATOR and notice is not None
        ):  # a SIGTERM while it starts is said as what it will do
            notice.plan = EVALUATOR_ON_SIGTERM
        conflict = machine.conflict()
        if conflict:
            warn(conflict)
        from tfdistx.engine.quiet_import import import_tensorflow  # deferred: TensorFlow starts here, and only here

        import_tensorflow()  # without its start-up banner
        if placement.task_type in data_service.JOBS:  # a tf.data service task: serves the trainers until stopped
            from tfdistx.engine.data_service import serve  # deferred: it imports TensorFlow

            return serve(placement, layout.strategy.facts, spec.cluster, notice)
        if (
            placement.task_type == EVALUATOR
        ):  # the sidecar evaluator (cluster.evaluator): beside the training, never failing it
            from tfdistx.engine import sidecar  # deferred: it imports TensorFlow

            return sidecar.run(spec, placement, notice) if training else None
        from tfdistx.engine import checkpointing, fit  # deferred: they import TensorFlow

        # The chief tells the run's servers how it ended, so that they end with it (cluster/training_end.py).
        with (
            training_end.told_to_the_servers(placement, layout.strategy.facts),
            checkpointing.stops_cleanly_when_unwritable(spec.checkpoint.dir, evaluating=mode == "evaluate"),
        ):
            if mode == "evaluate":
                return fit.evaluate(spec, placement, step)
            trained = fit.train(spec, placement, notice=notice)
        if process_ends_after:
            hold_until_exit(trained.runner)  # its input pipelines' teardown could stall the process's end
        return trained.objective


def warn(text: str) -> None:
    """On the terminal, and in the run's log (tfdistx.log) with the rest of the run."""
    line = f"tfdistx: warning: {text}"
    print(line, file=sys.stderr, flush=True)
    into_log_files(line, logging.WARNING)


def placement_of(layout: Layout, mode: str = "train") -> Placement:
    """Where this process stands: one process, the launcher of a local
    cluster, or a task a scheduler placed (TF_CONFIG, Slurm). Its chief is
    the process that writes the run directory."""
    # data.service feeds training only: an evaluation reads its data in the process that evaluates
    return cluster.detect(layout, training=mode == "train")


def local_tasks(layout: Layout, mode: str) -> Tuple[Dict[str, int], bool]:
    """The tasks a local launch starts (tasks per job, and whether a sidecar
    evaluator runs beside them), refused (ConfigError) when there are more
    processes than this machine can hold; --plan asks too."""
    # A one-process strategy launches here only to run beside its tf.data service: its trainer is the one worker.
    counts = {**layout.training_jobs(), **(layout.service_jobs() if mode == "train" else {})}
    evaluator = mode == "train" and layout.cluster.evaluator  # `tfdistx evaluate` needs no sidecar
    processes, most = sum(counts.values()) + evaluator, max(8, 4 * (os.cpu_count() or 1))
    if processes > most:  # each task is a whole TensorFlow process (docs/performance.md: peak RSS per task)
        raise ConfigError.one(
            "cluster",
            layout.cluster.name,
            f"a local cluster of {processes} processes"
            f"{' (with the sidecar evaluator)' if evaluator else ''} on this machine's {os.cpu_count()} cores: "
            f"at most {most} here; a larger cluster runs under Slurm or Kubernetes",
        )
    return counts, evaluator


def _elastic_rounds(spec: RunSpec, mode: str) -> Optional[dict]:
    """What the launcher needs to train in rounds (cluster/elastic.py); None
    when the run is not elastic (an evaluation never is: it runs once)."""
    keys = spec.cluster.elastic
    if mode != "train" or keys is None:
        return None
    return {
        "min": keys.min_workers,
        "max": spec.cluster.workers,
        "hosts": keys.hosts,
        "discover": keys.discover,
        "join_grace": keys.join_grace,
        "lost_bound": keys.lost_bound,
        "below_min_timeout": keys.below_min_timeout,
        **_where_rounds_are_told(spec.checkpoint.dir, spec.run_dir),
    }


def _where_rounds_are_told(checkpoint_dir: str, run_dir: Path) -> dict:
    """What the rounds' lines and file are read from and written to (cluster/rounds.py), elastic or agents'."""
    return {
        "checkpoint_dir": checkpoint_dir,
        "rounds_file": str(run_dir / "logs" / "rounds.json"),
        "metrics_file": str(run_dir / "metrics.jsonl"),
    }


def _objective_with_rounds(run_dir: Path, objective: str, rounds_file: Optional[str]):
    """The run's `objective` from its summary.json, which gets the rounds that
    trained (with_rounds) when `rounds_file` is given and there: the chief
    wrote the summary of its last round; the launcher, or the agent that
    kept the rounds, knows them all."""
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text())
    if rounds_file and Path(rounds_file).is_file():
        trained = with_rounds(summary, json.loads(Path(rounds_file).read_text()))
        if trained != summary:
            write_json(summary_path, trained)
            summary = trained
    return objective_value(objective, summary)


def with_rounds(summary: dict, rounds: list) -> dict:
    """summary.json with an elastic run's `rounds`: those that trained a step
    of it. A rerun of a finished run forms a round that trains nothing, and
    leaves the summary as it was (nothing of a run is rewritten by a rerun)."""
    return {**summary, "rounds": [r for r in rounds if r["first_step"] <= summary["step"]]}


# What every task of a local cluster imports before it knows its place: imported once, in the
# process the launcher forks the tasks from (cluster/prefork.py), TensorFlow's runtime not started.
TASK_PRELOAD = (
    "tfdistx.engine.quiet_import:import_before_fork",
    "tfdistx.cli",
    "tfdistx.commands.task",
    "tfdistx.engine.fit",
    "tfdistx.models",
)


def task_config(config: Mapping[str, Any]) -> str:
    """The resolved config every task of this run reads (the spec's `config`), as YAML: the same on
    every node of a run of agents (their own keys left out: this node's
    address, the secret's file), so that its digest tells the run's agents
    from another config's."""
    resolved = copy.deepcopy(dict(config))
    resolved["cluster"]["launch"] = "tf_config"
    resolved["cluster"].pop("agent", None)
    return OmegaConf.to_yaml(resolved)


def _task_command(
    run_dir: Path, resolved: Mapping[str, Any], mode: str, step: Optional[int], config: Optional[str] = None
) -> list:
    """The command that starts one task of this run (commands/task.py),
    placed by the TF_CONFIG its launcher or agent gives it, from the resolved
    config (the spec's `config`) written here. `config`: under agents, the config's digest, in the
    file's name: every node writes it into the one run directory, and a node
    of another config (which the rendezvous refuses) writes another file."""
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    task_config_file = logs / (f"{mode}-config-{config[:16]}.yaml" if config else f"{mode}-config.yaml")
    write_whole(task_config_file, task_config(resolved))
    return [
        sys.executable,
        "-m",
        "tfdistx",
        "_task",
        mode,
        str(run_dir),
        str(task_config_file),
        *([str(step)] if step is not None else []),
    ]


def _run_agent(spec: RunSpec, mode: str, notice: Optional[SigtermNotice], config_record: Optional[dict] = None):
    """This node's agent (cluster/agent.py): its worker in each round the
    agents form (and, on the node that keeps the rounds, the run's servers:
    a parameter-server run's chief and ps, the tf.data service's); the agent
    that keeps the rounds records the run's config (`config_record`) and finishes the summary."""
    if mode != "train":
        raise ConfigError.one(
            "cluster.launch", "agent", "agents train; `tfdistx evaluate` runs with cluster.launch=local or tf_config"
        )
    layout, run_dir, cluster = spec.layout, spec.run_dir, spec.cluster
    per_pool, why = threads.task_threads(cluster.task_threads, layout.jobs_on_an_agents_node(keeper=False))
    keepers_pool, _ = threads.task_threads(cluster.task_threads, layout.jobs_on_an_agents_node(keeper=True))
    agent = cluster.agent
    elastic_keys = cluster.elastic
    told = _where_rounds_are_told(spec.checkpoint.dir, run_dir)
    config = hashlib.sha256(
        task_config(spec.config).encode()
    ).hexdigest()  # the rendezvous admits the run's config only
    code = run_agent(
        {
            "command": _task_command(run_dir, spec.config, mode, None, config),
            "run_dir": str(run_dir),
            "log_dir": str(run_dir / "logs"),
            "primary": list(layout.strategy.facts.primary_jobs),
            "restart_alone": list(layout.strategy.facts.restartable_alone),
            "servers": dict(layout.servers_beside_the_keeper()),
            "keeper_task_env": threads.environment(keepers_pool),
            "max_restarts": cluster.max_restarts,
            "stopped_task_timeout": cluster.stopped_task_timeout,
            "run_log": str(run_dir / "tfdistx.log"),
            "preemption_grace": cluster.preemption_grace,
            "peer_timeout": cluster.peer_timeout,
            "notice_signals": list(cluster.notice_signals),
            "task_env": threads.environment(per_pool),
            "preload": list(TASK_PRELOAD) if cluster.prefork else [],
            "evaluator": cluster.evaluator,  # run by the agent that keeps the rounds
            "config_record": config_record or {},  # written into .hydra/ by the agent that keeps the rounds
            "agent": {
                "store": agent.store,
                "address": agent.address,
                "token_file": agent.token_file,
                "config": config,
                "min": elastic_keys.min_workers if elastic_keys else cluster.workers,
                "max": cluster.workers,
                "join_grace": agent.join_grace,
                "lost_bound": agent.lost_bound,
                "below_min_timeout": agent.below_min_timeout,
                **told,
            },
        },
        notice,
    )
    if code:
        sys.exit(code)
    return _objective_with_rounds(run_dir, spec.trainer.objective, told["rounds_file"] if elastic_keys else None)


def _run_local_cluster(spec: RunSpec, mode: str, step: Optional[int], notice: Optional[SigtermNotice]):
    """Every task runs this job from the resolved config written here, in
    the same run directory; only the chief writes the run's files."""
    layout, run_dir = spec.layout, spec.run_dir
    counts, evaluator = local_tasks(layout, mode)
    command = _task_command(run_dir, spec.config, mode, step)
    under_mpi = mpi.chosen(spec.strategy.options)
    if (
        under_mpi
    ):  # each task a world of one of MPI's, which joins its peers (spec/mpi.py); not forked from a prefork then
        command = mpi.task_command(command)
    per_pool, why = threads.task_threads(layout.cluster.task_threads, counts)  # an elastic run: sized for MAX workers
    into_log_files(
        f"tfdistx: each task's TensorFlow threads: {threads.describe(per_pool)}; {why}"
    )  # the run's log, not the terminal
    rounds = _elastic_rounds(spec, mode)
    facts, cluster = layout.strategy.facts, layout.cluster
    code = run_local_cluster(
        counts,
        command,
        str(run_dir / "logs"),
        task_env=threads.environment(per_pool),
        primary=list(facts.primary_jobs),
        isolate=cluster.isolate,
        max_restarts=cluster.max_restarts,
        restart_alone=list(facts.restartable_alone),
        stopped_task_timeout=cluster.stopped_task_timeout,
        run_log=str(run_dir / "tfdistx.log"),
        evaluator=evaluator,
        preemption_grace=cluster.preemption_grace,
        peer_timeout=cluster.peer_timeout,
        notice=notice,
        notice_signals=cluster.notice_signals,
        elastic=rounds,
        preload=TASK_PRELOAD if cluster.prefork and not under_mpi else (),
        nice=cluster.nice,
    )
    if code:  # Ctrl-C's (130) one line is the supervisor's, or the tasks' that saved
        sys.exit(code)
    if mode == "evaluate":
        return json.loads((run_dir / "evaluations.jsonl").read_text().splitlines()[-1])
    return _objective_with_rounds(run_dir, spec.trainer.objective, rounds["rounds_file"] if rounds else None)

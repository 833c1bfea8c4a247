"""Where a command meets the engine: train or evaluate in this process, or
as a local cluster of processes that each do it (cluster/launch.py).

The composed config is resolved into a RunSpec here, the one hand-over
from the config side to the engine. TensorFlow is imported only on the
in-process path: a local cluster's launcher never starts it.
"""

import json
import logging
import os
import sys
from pathlib import Path
from typing import Dict, Optional, Tuple

from omegaconf import DictConfig, OmegaConf

from tfdistx import machine
from tfdistx.cluster import placement as cluster
from tfdistx.cluster.evaluator import EVALUATOR, EVALUATOR_ON_SIGTERM
from tfdistx.cluster.launch import run_local_cluster
from tfdistx.cluster.rendezvous import LOCAL_CLUSTER_ENV
from tfdistx.commands.ending import hold_until_exit
from tfdistx.cluster.placement import Placement, Source
from tfdistx.config import data_service, elastic, strategies, threads
from tfdistx.config.errors import ConfigError, retryable_exits_offset_by
from tfdistx.config.objective import value as objective_value
from tfdistx.config.resolve import resolve
from tfdistx.engine.loggers import into_log_files, write_json  # no TensorFlow there
from tfdistx.sigterm import SigtermNotice


def execute(cfg: DictConfig, run_dir: str, mode: str, step: Optional[int] = None, process_ends_after: bool = False,
            notice: Optional[SigtermNotice] = None, placement: Optional[Placement] = None):
    """Train (mode "train") or evaluate (mode "evaluate") as `cfg` says, in
    `run_dir`. `notice`: the process's SIGTERM notice (sigterm.py), taken
    at its start; a training run without one takes it here. `placement`:
    where this process stands (placement_of), when the caller has it.
    `process_ends_after`: the process ends as soon as this returns
    (cli.end_process), so what the run built is held until then."""
    if mode == "train" and notice is None:
        with SigtermNotice() as notice:
            return execute(cfg, run_dir, mode, step, process_ends_after, notice, placement)
    facts = strategies.get(cfg.strategy.name, cfg.cluster.workers, cfg.cluster.devices_per_worker)
    placement = placement or placement_of(cfg, mode)
    stale = facts.stale_gradients_warning(cfg.cluster.workers, cfg.trainer.steps) if mode == "train" else None
    if stale and placement.is_chief and placement.source is not Source.LOCAL:  # once: by the task that trains, not its launcher
        warn(stale)
    not_exact = data_service.resume_warning(cfg.data, cfg.trainer.deterministic) if mode == "train" else None
    if not_exact and placement.is_chief and placement.source is not Source.LOCAL:  # once: by the trainer that writes the run
        warn(not_exact)
    if placement.in_cluster:
        refused = elastic.placed_by_a_scheduler(cfg.cluster, launched_by_tfdistx=bool(os.environ.get(LOCAL_CLUSTER_ENV)))
        if refused:
            raise ConfigError(refused)
    with retryable_exits_offset_by(cfg.cluster.retryable_exit_offset):
        if placement.source is Source.LOCAL:
            return _run_local_cluster(cfg, run_dir, facts, mode, step, notice)
        spec = resolve(cfg, run_dir)
        if placement.task_type == EVALUATOR and notice is not None:  # a SIGTERM while it starts is said as what it will do
            notice.plan = EVALUATOR_ON_SIGTERM
        conflict = machine.conflict()
        if conflict:
            warn(conflict)
        from tfdistx.engine.quiet_import import import_tensorflow  # deferred: TensorFlow starts here, and only here

        import_tensorflow()  # without its start-up banner
        if placement.task_type in data_service.JOBS:  # a tf.data service task: serves the trainers until stopped
            from tfdistx.engine.data_service import serve  # deferred: it imports TensorFlow

            return serve(placement, facts, spec.cluster.preemption_grace, notice)
        if placement.task_type == EVALUATOR:  # the sidecar evaluator (cluster.evaluator): beside the training, never failing it
            from tfdistx.engine import sidecar  # deferred: it imports TensorFlow

            return sidecar.run(spec, placement, notice) if mode == "train" else None
        from tfdistx.engine import checkpointing, fit  # deferred: they import TensorFlow

        with checkpointing.stops_cleanly_when_unwritable(spec.checkpoint.dir, evaluating=mode == "evaluate"):
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


def placement_of(cfg: DictConfig, mode: str = "train") -> Placement:
    """Where this process stands: one process, the launcher of a local
    cluster, or a task a scheduler placed (TF_CONFIG, Slurm). Its chief is
    the process that writes the run directory."""
    facts = strategies.get(cfg.strategy.name, cfg.cluster.workers, cfg.cluster.devices_per_worker)
    # data.service feeds training only: an evaluation reads its data in the process that evaluates
    return cluster.detect(facts, cfg.cluster, service_jobs=data_service.job_counts(cfg.data) if mode == "train" else {})


def local_tasks(cfg: DictConfig, facts: strategies.Strategy, mode: str) -> Tuple[Dict[str, int], bool]:
    """The tasks a local launch starts (tasks per job, and whether a sidecar
    evaluator runs beside them), refused (ConfigError) when there are more
    processes than this machine can hold; --plan asks too."""
    # A one-process strategy launches here only to run beside its tf.data service: its trainer is the one worker.
    counts = {**(facts.job_counts(cfg.cluster.workers, cfg.cluster.ps) or {"worker": 1}),
              **(data_service.job_counts(cfg.data) if mode == "train" else {})}
    evaluator = mode == "train" and bool(cfg.cluster.get("evaluator"))  # `tfdistx evaluate` needs no sidecar
    processes, most = sum(counts.values()) + evaluator, max(8, 4 * (os.cpu_count() or 1))
    if processes > most:  # each task is a whole TensorFlow process (docs/performance.md: peak RSS per task)
        raise ConfigError.one("cluster", cfg.cluster.name, f"a local cluster of {processes} processes"
                              f"{' (with the sidecar evaluator)' if evaluator else ''} on this machine's {os.cpu_count()} cores: "
                              f"at most {most} here; a larger cluster runs under Slurm or Kubernetes")
    return counts, evaluator


def _elastic_rounds(cfg: DictConfig, run_dir: str, mode: str) -> Optional[dict]:
    """What the launcher needs to train in rounds (cluster/elastic.py); None
    when the run is not elastic (an evaluation never is: it runs once)."""
    if mode != "train" or not elastic.is_elastic(cfg.cluster):
        return None
    low, high = elastic.worker_range(cfg.cluster)
    keys = cfg.cluster.elastic
    return {"min": low, "max": high, "hosts": keys.hosts, "discover": keys.discover, "join_grace": keys.join_grace,
            "lost_bound": keys.lost_bound, "below_min_timeout": keys.below_min_timeout,
            "checkpoint_dir": cfg.checkpoint.dir or str(Path(run_dir) / "checkpoints"),
            "rounds_file": str(Path(run_dir) / "logs" / "rounds.json"), "metrics_file": str(Path(run_dir) / "metrics.jsonl")}


def with_rounds(summary: dict, rounds: list) -> dict:
    """summary.json with an elastic run's `rounds`: those that trained a step
    of it. A rerun of a finished run forms a round that trains nothing, and
    leaves the summary as it was (nothing of a run is rewritten by a rerun)."""
    return {**summary, "rounds": [r for r in rounds if r["first_step"] <= summary["step"]]}


def _run_local_cluster(cfg: DictConfig, run_dir: str, facts: strategies.Strategy, mode: str, step: Optional[int],
                       notice: Optional[SigtermNotice]):
    """Every task runs this job from the resolved config written here, in
    the same run directory; only the chief writes the run's files."""
    counts, evaluator = local_tasks(cfg, facts, mode)
    logs = Path(run_dir, "logs")
    logs.mkdir(parents=True, exist_ok=True)
    task_config = logs / f"{mode}-config.yaml"
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["cluster"]["launch"] = "tf_config"  # each task is placed by the TF_CONFIG the launcher gives it
    task_config.write_text(OmegaConf.to_yaml(resolved))
    command = [sys.executable, "-m", "tfdistx", "_task", mode, str(run_dir), str(task_config), *([str(step)] if step is not None else [])]
    per_pool, why = threads.task_threads(cfg.cluster.get("task_threads", threads.AUTO), counts)  # an elastic run: sized for MAX workers
    into_log_files(f"tfdistx: each task's TensorFlow threads: {threads.describe(per_pool)}; {why}")  # the run's log, not the terminal
    rounds = _elastic_rounds(cfg, run_dir, mode)
    code = run_local_cluster(counts, command, str(logs), task_env=threads.environment(per_pool),
                             primary=list(facts.primary_jobs), isolate=cfg.cluster.isolate,
                             max_restarts=cfg.cluster.max_restarts, restart_alone=list(facts.restartable_alone),
                             stopped_task_timeout=cfg.cluster.stopped_task_timeout, run_log=str(Path(run_dir) / "tfdistx.log"),
                             evaluator=evaluator, preemption_grace=cfg.cluster.preemption_grace, notice=notice, elastic=rounds)
    if code == 130:  # Ctrl-C: the tasks stopped quietly (commands/task.py)
        print("tfdistx: interrupted", file=sys.stderr)
    if code:
        sys.exit(code)
    if mode == "evaluate":
        return json.loads(Path(run_dir, "evaluations.jsonl").read_text().splitlines()[-1])
    if rounds:  # the chief wrote the summary of its last round; the launcher knows them all
        summary = json.loads(Path(run_dir, "summary.json").read_text())
        trained = with_rounds(summary, json.loads(Path(rounds["rounds_file"]).read_text()))
        if trained != summary:
            write_json(Path(run_dir, "summary.json"), trained)
    return objective_value(cfg.trainer.objective, json.loads(Path(run_dir, "summary.json").read_text()))

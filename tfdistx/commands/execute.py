"""Where a command meets the engine: train or evaluate in this process, or
start the run's processes, each of which does it (the launch that starts
them: tfdistx/launch/, `cluster.launch`).

The composed config is resolved into a RunSpec first thing here, the one
hand-over from the config side: placement, the local launcher and the
engine read the spec, never the config. TensorFlow is imported only on the
in-process path: a local cluster's launcher never starts it.
"""

import copy
import dataclasses
import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from tfdistx import launch as launches
from tfdistx import machine
from tfdistx.cluster import training_end
from tfdistx.cluster.evaluator import EVALUATOR, EVALUATOR_ON_SIGTERM
from tfdistx.cluster.launch_spec import RoundsRecord
from tfdistx.cluster.rendezvous import LOCAL_CLUSTER_ENV
from tfdistx.commands.ending import hold_until_exit
from tfdistx.cluster.placement import Placement
from tfdistx.launch.base import TaskStart
from tfdistx.core import data_service, typed_json
from tfdistx.core.errors import ConfigError, retryable_exits_offset_by
from tfdistx.core.objective import value as objective_value
from tfdistx.config.resolve import resolve
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.core.run_spec import Layout, RunSpec
from tfdistx.log_files import into_log_files
from tfdistx.whole_files import write_json, write_whole
from tfdistx.sigterm import SigtermNotice


def execute(cfg: DictConfig, run_dir: str, mode: str, *args, **how):
    """execute_spec for the composed `cfg`, resolved here into the run spec of `run_dir`: the one reader of the
    config, from here on the spec."""
    return execute_spec(resolve(cfg, run_dir), mode, *args, **how)


def execute_spec(
    spec: RunSpec,
    mode: str,
    step: Optional[int] = None,
    process_ends_after: bool = False,
    notice: Optional[SigtermNotice] = None,
    placement: Optional[Placement] = None,
    config_record: Optional[dict] = None,
):
    """Train (mode "train") or evaluate (mode "evaluate") as the run spec
    says (a task of a local cluster or an agent is handed it:
    commands/task.py). `notice`: the process's SIGTERM notice (sigterm.py),
    taken at its start; a training run without one takes it here.
    `placement`: where this process stands (placement_of), when the caller
    has it. `config_record`: the run's .hydra/ files, which an agent's node
    records if it keeps the rounds (commands/run.py). `process_ends_after`:
    the process ends as soon as this returns (cli.end_process), so what the
    run built is held until then."""
    if mode == "train" and notice is None:
        with SigtermNotice() as notice:
            return execute_spec(spec, mode, step, process_ends_after, notice, placement, config_record)
    layout, training = spec.layout, mode == "train"
    if notice is not None:  # taken with the default signals before the config was known: now the config's
        notice.listen(layout.cluster.notice_signals)
    placement = placement or placement_of(layout, mode)
    if placement.gpus is not None:  # its share of its node's GPUs (`job slurm --gpus`), before TensorFlow sees any
        os.environ["CUDA_VISIBLE_DEVICES"] = placement.gpus
    if training and placement.is_chief and not placement.starts_processes:  # once: by the task that trains
        for warning in (
            layout.strategy.row.stale_gradients_warning(layout.cluster.workers, spec.trainer.steps),
            data_service.mode_resume_warning(
                layout.service.mode if layout.service else None, spec.trainer.deterministic
            ),
        ):
            if warning:
                warn(warning)
    if placement.in_cluster:
        launched_by_tfdistx = bool(os.environ.get(LOCAL_CLUSTER_ENV))
        refused = launches.refused_in_a_placed_task(layout, launched_by_tfdistx)
        if refused:
            raise ConfigError(refused)
    with retryable_exits_offset_by(layout.cluster.retryable_exit_offset):
        if placement.starts_processes:  # the local launcher, a node's agent
            return _start_processes(spec, placement.launch, mode, step, notice, config_record)
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

            return serve(placement, layout.strategy.row, spec.cluster, notice)
        if (
            placement.task_type == EVALUATOR
        ):  # the sidecar evaluator (cluster.evaluator): beside the training, never failing it
            from tfdistx.engine import sidecar  # deferred: it imports TensorFlow

            return sidecar.run(spec, placement, notice) if training else None
        from tfdistx.engine import checkpointing, fit  # deferred: they import TensorFlow

        # The chief tells the run's servers how it ended, so that they end with it (cluster/training_end.py).
        with (
            training_end.told_to_the_servers(placement, layout.strategy.row),
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
    return launches.detect(layout, training=mode == "train")


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


def task_spec(spec: RunSpec) -> RunSpec:
    """The run spec every task of this run is handed: placed by the TF_CONFIG its launcher or agent gives it
    (cluster.launch=tf_config), without the agents' own keys (this node's address, the secret's file), in its
    cluster and in the resolved config it records; the same on every node of a run of agents."""
    resolved = copy.deepcopy(dict(spec.config))
    resolved["cluster"]["launch"] = LaunchMode.TF_CONFIG.value
    resolved["cluster"].pop("agent", None)
    cluster = dataclasses.replace(spec.cluster, launch=LaunchMode.TF_CONFIG, agent=None)
    return dataclasses.replace(spec, cluster=cluster, config=MappingProxyType(resolved))


def task_config(spec: RunSpec) -> str:
    """The resolved config every task of this run reads, as YAML, whose digest tells the run's agents from
    another config's."""
    return OmegaConf.to_yaml(dict(task_spec(spec).config))


def _task_command(spec: RunSpec, mode: str, step: Optional[int], config: Optional[str] = None) -> list:
    """The command that starts one task of this run (commands/task.py),
    placed by the TF_CONFIG its launcher or agent gives it, from the run spec
    written here (typed JSON: the task resolves nothing again). `config`: under agents, the config's digest, in the
    file's name: every node writes it into the one run directory, and a node
    of another config (which the rendezvous refuses) writes another file."""
    logs = spec.run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    task_spec_file = logs / (f"{mode}-spec-{config[:16]}.json" if config else f"{mode}-spec.json")
    write_whole(task_spec_file, typed_json.dumps(task_spec(spec)))
    return [
        sys.executable,
        "-m",
        "tfdistx",
        "_task",
        mode,
        str(spec.run_dir),
        str(task_spec_file),
        *([str(step)] if step is not None else []),
    ]


def _start_processes(
    spec: RunSpec,
    launch: LaunchMode,
    mode: str,
    step: Optional[int],
    notice: Optional[SigtermNotice],
    config_record: Optional[dict],
):
    """Start the run's processes (the launch of `launch`: its local launcher, or this node's agent) and keep them
    to the run's end; then the run's objective (with the rounds that trained, for a run in rounds), or the
    evaluation's metrics. `config_record`: the run's .hydra/ files, which the agent that keeps the rounds writes."""
    chosen = launches.of(launch)
    chosen.refuse(spec.layout, mode)  # before anything is written
    # Under agents, the digest of the config every task reads: the rendezvous admits that config only.
    config = hashlib.sha256(task_config(spec).encode()).hexdigest() if launch is LaunchMode.AGENT else ""
    task = TaskStart(
        mode, tuple(_task_command(spec, mode, step, config or None)), TASK_PRELOAD, config, config_record or {}
    )
    code = chosen.start(spec, task, notice)
    if code:  # Ctrl-C's (130) one line is the supervisor's, or the tasks' that saved
        sys.exit(code)
    if mode == "evaluate":
        return json.loads((spec.run_dir / "evaluations.jsonl").read_text().splitlines()[-1])
    in_rounds = spec.cluster.elastic is not None
    return _objective_with_rounds(
        spec.run_dir,
        spec.trainer.objective,
        RoundsRecord.of(spec.run_dir, spec.checkpoint.dir).rounds_file if in_rounds else None,
    )

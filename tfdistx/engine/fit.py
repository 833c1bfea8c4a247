"""A run, in its phases (cf. Model Garden's train_lib.run_experiment and
Orbit's controller): join the cluster → build the parts → restore or
warm-start → the loop → finish. Each phase is a module of its own, taking
and returning typed values:

    join.join_cluster   cluster, strategy, placement -> Joined: TO_TRAIN, or SERVED (a ps only serves)
    build.build_run     spec, placement       -> Run: strategy, task, data, model, optimizer, checkpointer
    start.restore_or_warm_start  Run           -> Start: the step, what was restored, what is left
    fit.train_loop      Run, runner, Start, loggers -> loop.Result (the loggers open until finish is done)
    finish.finish       Run, Start, Result     -> the objective (summary.json and export/ by the chief)

What a run sets for its whole process (seed, op determinism, TensorFlow's
log levels) is set once, by process_wide.settings_for. Also `evaluate`: the
same first phases, then one evaluation. Only the chief writes the run
directory's files.
"""

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

from tfdistx import boundary_marks, whole_files
from tfdistx.cluster import training_end
from tfdistx.cluster.placement import Placement
from tfdistx.core.errors import ConfigError
from tfdistx.core.run_spec import RunSpec
from tfdistx.data.files import input_errors_in_one_line
from tfdistx.engine import callbacks, checkpointing, loggers, process_wide
from tfdistx.engine.build import Run, build_run
from tfdistx.engine.commit import Commit
from tfdistx.engine.finite import NonFiniteWeights
from tfdistx.engine.finish import finish, finish_finished_run
from tfdistx.engine.join import Joined, join_cluster
from tfdistx.engine.checkpointing import Checkpointer
from tfdistx.engine.loop import CheckPreemption, Log, Loop, Result, SaveCheckpoints, Schedule
from tfdistx.engine.preemption import (
    PreemptionWatcher,
    lost_peer_in_one_line,
    peers_gone_abort_the_collectives,
    sum_over_tasks,
    watching_servers,
)
from tfdistx.engine.profiling import ProfileSteps
from tfdistx.engine.runner import StepRunner, make_runner
from tfdistx.engine.start import Start, restore_or_warm_start
from tfdistx.sigterm import SigtermNotice

log = logging.getLogger(__name__)


@dataclass
class Trained:
    objective: Optional[float]  # trainer.objective's value (None: a task that only served, or a non-chief's rerun)
    # The runner, with its input pipelines: destroying them can wait minutes on
    # tf.data's thread pools (commands/ending.py), so a caller
    # that ends the process right after holds this until then (cli.end_process).
    runner: Optional[StepRunner] = None


def train(spec: RunSpec, placement: Optional[Placement] = None, notice: Optional[SigtermNotice] = None) -> Trained:
    """Train as `spec` says. `placement`: this process's task in a cluster
    (None: a single process). `notice`: the process's SIGTERM notice
    (sigterm.py), taken from its start; without one, SIGTERM is this
    run's while it trains."""
    if notice is None:
        with SigtermNotice(signals=spec.cluster.notice_signals) as notice:
            return train(spec, placement, notice)
    started = time.time()
    placement = placement or Placement()
    if join_cluster(spec.cluster, spec.strategy.row, placement, notice) is Joined.SERVED:
        return Trained(None)  # a parameter-server cluster's ps or worker task: served until stopped
    with process_wide.settings_for(spec.trainer.seed, spec.trainer.deterministic):
        run = build_run(spec, placement)
        with run.checkpointer:  # a save in flight is waited for, then the scratch removed
            start = restore_or_warm_start(run)
            if start.finished:
                return Trained(finish_finished_run(run, start, started))
            runner = make_runner(run, skip_steps=start.step)
            # The loggers stay open until the run has finished: what they do at its end (W&B's summary and model
            # artifact) reads the summary.json and export that finish writes.
            with loggers.for_run(
                run.dir,
                spec.logger,
                run.total_steps,
                start.step,
                enabled=run.placement.is_chief,
                config=_plain(spec.config),
            ) as sinks:
                result = train_loop(run, runner, start, notice, sinks)
                objective = finish(run, start, result, started)
                loggers.finished(sinks)
            return Trained(objective, runner)


def train_loop(run: Run, runner: StepRunner, start: Start, notice: SigtermNotice, sinks: list) -> Result:
    """The loop, with its actions: log (to `sinks`, the run's loggers),
    track the objective (the best checkpoint, early stopping), checkpoint,
    stop cleanly when preempted, and (in a cluster) when a peer or a
    server it waits on is lost."""
    spec = run.spec
    log.info(
        "%s: %s, global batch %d, %d steps, task %s",
        run.strategy_name,
        run.replicas_text,
        run.global_batch,
        run.total_steps,
        run.task.name,
    )
    if run.placement.is_chief:
        log.info("run dir: %s", run.dir.resolve())
    schedule = Schedule(run.total_steps, spec.trainer.steps_per_loop, spec.trainer.log_every, spec.trainer.eval_every)
    in_cluster = run.placement.in_cluster
    synchronous_cluster = in_cluster and not run.row.asynchronous
    # A lost peer costs at most one loop: the chief saves the last loop boundary's state, kept in memory (commit.py).
    commit = Commit(run.checkpointer.checkpoint) if synchronous_cluster and run.placement.is_chief else None
    with (
        lost_peer_in_one_line(
            synchronous_cluster,
            parameter_servers=in_cluster and run.row.asynchronous,
            placement=run.placement,
            peer_timeout=spec.cluster.peer_timeout,
            keep=(lambda: save_the_last_boundary(run.checkpointer, commit)) if commit else None,
        ),
        watching_servers(
            run.placement,
            spec.cluster,
            coordinator=run.coordinator is not None,
            progressed=lambda: getattr(runner, "progressed", time.monotonic()),
            servers_told=training_end.servers_of(run.placement, run.row),
        ),
        peers_gone_abort_the_collectives(run.placement) if synchronous_cluster else contextlib.nullcontext(),
        input_errors_in_one_line(run.source),
    ):
        # A SIGTERM checkpoints and exits 42 (parameter servers: the coordinator saves alone).
        preemption = PreemptionWatcher(run.strategy, run.checkpointer, synchronous_cluster, notice)
        # Never a checkpoint of a NaN loss or NaN weights; weights that are not numbers stop the run (finite.py).
        saves = SaveCheckpoints(
            run.checkpointer,
            spec.checkpoint.every_steps,
            nonfinite_weights=NonFiniteWeights(run.train_variables or run.model.trainable_variables),
        )
        if start.tracker and start.tracker.save_best:  # the best checkpoint: never one of such a state either
            start.tracker.save_best = saves.keeps(start.tracker.save_best)
        # The tracker first: it may save the best checkpoint, which every worker of a synchronous cluster does
        # at once, so no action that only the chief runs (its loggers, its callbacks) may come before it; and
        # before the saves, which carry its state.
        # The commit first (the chief's alone, and nothing collective in it): its copy is the boundary's, taken before
        # any other action's before_steps may change the state.
        actions = [
            *([commit] if commit else []),
            *([start.tracker] if start.tracker else []),
            Log(sinks),
            *users_callbacks(run, schedule, synchronous_cluster),
            saves,
            CheckPreemption(preemption),
        ]
        profile = profile_steps(run)
        with contextlib.closing(profile) if profile else contextlib.nullcontext():  # a failed run's trace is kept too
            result = Loop(
                runner,
                schedule,
                run.step_counter,
                actions + ([profile] if profile else []),
                learning_rate_at=run.learning_rate.at,
                running=running_record(run.running, runner.metrics.size, run.placement.is_chief),
            ).run()
        preemption.done()  # the final checkpoint is saved: a notice now lets the run finish (docs/preemption.md)
        return result


def running_record(saved: Optional[checkpointing.RunningRecordState], metric_count: int, is_chief: bool):
    """The loop's running record as the checkpoint resumed from left it
    (`saved`); a fresh one when its sums are of other metrics than this
    run's `metric_count` (said once, by the chief)."""
    if saved is None:
        return None
    record = saved.record
    if not record.fits(metric_count):
        if is_chief:
            log.info("the running record of the checkpoint resumed from is of other metrics: the first record restarts")
        record.window, record.window_time, record.epoch = None, 0.0, None
    return record


def save_the_last_boundary(checkpointer: Checkpointer, commit: Commit) -> Optional[str]:
    """After a lost peer: the last loop boundary's state put back and saved
    as the run's checkpoint of that step; what a restart then resumes from,
    as the task's line says it. None when a checkpoint of that step or a
    later one was saved already (the loop's end, say): the newest is the
    one to resume from."""
    step, last = commit.step, checkpointer.last_saved
    if not step or (last is not None and last >= step):
        return None
    boundary_marks.mark(boundary_marks.SAVING)  # its supervisor waits for the save, not only for the call to fail
    commit.restore()
    checkpointer.save(step)
    return f"from step {step}, the last loop boundary, saved now"


def users_callbacks(run: Run, schedule: Schedule, synchronous_cluster: bool) -> list:
    """The `callbacks` group's, built on the chief (engine/callbacks.py);
    in a synchronous cluster, every task follows what they and the chief's
    loggers did (a stop, a learning rate, a failure)."""
    built = (
        callbacks.build(
            run.spec.callbacks,
            run.model,
            run.optimizer,
            schedule,
            run.dir,
            run.callback_states,
            evaluates=run.source.eval is not None,
        )
        if run.placement.is_chief
        else []
    )
    run.stop_record.watch(built)  # a stop one of them asks for is saved with the checkpoint of its step
    if synchronous_cluster:
        return [
            *built,
            callbacks.AgreeWithTheChief(
                sum_over_tasks(run.strategy),
                built,
                run.learning_rate.scale,
                run.placement.is_chief,
                every_call=bool(run.spec.callbacks),
            ),
        ]
    return built


def profile_steps(run: Run) -> Optional[ProfileSteps]:
    """The action that traces trainer.profile_steps, into the run's TensorBoard
    directory (whether or not the TensorBoard logger is on: TensorBoard's
    Profile tab reads it there). Only the chief writes; every task stops
    where it does."""
    spec = run.spec
    if spec.trainer.profile_steps is None:
        return None
    start, end = spec.trainer.profile_steps
    if end > run.total_steps and run.placement.is_chief:  # trainer.epochs: validation could not know the steps
        log.warning(
            "trainer.profile_steps=[%d, %d]: the run has %d steps; the trace ends with it", start, end, run.total_steps
        )
    note = "" if "tensorboard" in spec.logger.on else " (logger.tensorboard=false: the directory holds only the trace)"
    return ProfileSteps(start, end, (run.dir / "tensorboard").resolve(), writes=run.placement.is_chief, note=note)


def evaluate(spec: RunSpec, placement: Optional[Placement] = None, step: Optional[int] = None) -> Optional[dict]:
    """Evaluate a kept checkpoint (the newest, or the one at `step`) on the
    configured eval data; the chief appends the metrics to evaluations.jsonl."""
    path = checkpointing.find(spec.checkpoint.dir, step)  # before building anything
    placement = placement or Placement()
    if join_cluster(spec.cluster, spec.strategy.row, placement, SigtermNotice()) is Joined.SERVED:
        return None
    with process_wide.settings_for(spec.trainer.seed, spec.trainer.deterministic):
        run = build_run(spec, placement)
        with run.checkpointer:  # a save in flight is waited for, then the scratch removed
            try:
                run.checkpointer.restore(path)  # whole, or refused: never a model left partly at its initial weights
            except checkpointing.Damaged as damage:
                raise ConfigError.for_key("checkpoint", path, f"cannot be read: {damage}") from None
            metrics = make_runner(run, train=False).evaluate()
    record = {
        "checkpoint": os.path.basename(path),
        "step": int(run.step_counter.numpy()),
        "strategy": run.strategy_name,
        "replicas": run.replicas,
        **metrics,
    }
    if run.placement.is_chief:
        whole_files.append_jsonl(run.dir / "evaluations.jsonl", record)
    return record


def _plain(mapping: Any):
    """A MappingProxy tree as plain dicts (what the loggers serialise)."""
    if hasattr(mapping, "items"):
        return {k: _plain(v) for k, v in mapping.items()}
    if isinstance(mapping, list):
        return [_plain(v) for v in mapping]
    return mapping

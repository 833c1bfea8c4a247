"""The third of a run's phases (engine/fit.py): where training starts.

A run resumes from the newest intact checkpoint of its directory (at its
step, its input position, its objective's best so far, on another
topology if it moved), or starts at step 0: from a warm start's weights
(checkpoint.init_from), or beside the run that was there, whose files are
kept aside (checkpoint.restore=false, or no checkpoint there can be read).
Files are set aside only once nothing can refuse the run any more: a
refused run changes nothing. A run with nothing left to train (it reached
trainer.steps, or early stopping's patience is spent) is said so here, and
finished elsewhere (engine/finish.py).
"""

import logging
import os
from dataclasses import dataclass
from typing import Optional

from tfdistx.core.errors import ConfigError
from tfdistx.core.objective import lower_is_better
from tfdistx.engine import topology
from tfdistx.engine.build import Run
from tfdistx.engine.loop import TrackObjective
from tfdistx.engine.warm_start import warm_start
from tfdistx.rundir import set_aside_previous_run

log = logging.getLogger(__name__)

FINISHED, STOPPED_EARLY = "finished", "stopped early"


@dataclass
class Start:
    step: int
    restored: Optional[str]  # the checkpoint resumed from; None: a new run
    tracker: Optional[TrackObjective]  # the best checkpoint and early stopping, when asked for
    finished: Optional[str] = None  # FINISHED or STOPPED_EARLY: nothing left to train
    stopped_because: Optional[str] = None  # STOPPED_EARLY: why (the summary's stopped_early reason)
    resumed_from_topology: Optional[dict] = None  # the restored checkpoint's topology, when another than this run's


def restore_or_warm_start(run: Run) -> Start:
    spec = run.spec
    restored = run.checkpointer.restore_latest() if spec.checkpoint.restore else None
    step = int(run.step_counter.numpy())
    if step > run.total_steps:  # nothing to train, and a summary of nothing would replace the run's
        raise ConfigError.for_key(
            "trainer.steps",
            run.total_steps,
            f"the run in this directory is already at step {step} "
            f"({os.path.basename(restored)}): ask for {step} steps or more, or use another hydra.run.dir",
        )
    start = Start(step, restored, objective_tracker(run))
    stopped = stopped_early(run, start.tracker) if restored else None
    if restored and step == run.total_steps:
        start.finished = FINISHED
    elif stopped:  # stopped early: as finished, never trained on
        start.finished, start.stopped_because = STOPPED_EARLY, stopped
    elif restored:
        log.info("resuming from step %d (%s)", step, restored)
        start.resumed_from_topology = resumed_from_topology(run, restored, step)
        if spec.checkpoint.init_from:  # a rerun of a warm-started run resumes, never re-initialises
            log.info(
                "checkpoint.init_from=%s is not applied: it initialises a new run, and this one resumes from its own "
                "checkpoint",
                spec.checkpoint.init_from.path,
            )
    else:
        if spec.checkpoint.init_from:
            warm_start(run)
        if not spec.checkpoint.restore or run.checkpointer.only_damaged:
            start_over_beside_previous_run(run)
    return start


def stopped_early(run: Run, tracker: Optional[TrackObjective]) -> Optional[str]:
    """Why the restored checkpoint's run stopped early, or None: a callback
    of its config asked to stop at that step (callbacks.StopRecord), or
    trainer.early_stopping's patience was spent (its state)."""
    if run.stop_record is not None:
        by_callback = run.stop_record.stopped(run.spec.callbacks)
        if by_callback:
            return by_callback
    if tracker and tracker.exhausted():
        return tracker.reason(run.objective_state.read())
    return None


def objective_tracker(run: Run) -> Optional[TrackObjective]:
    """The action that keeps the best checkpoint and stops early, when asked for."""
    spec = run.spec
    objective, patience = spec.trainer.objective, spec.trainer.early_stopping.patience
    if not spec.checkpoint.keep_best and patience is None:
        return None
    if (
        spec.checkpoint.keep_best
        and objective.startswith("eval/")
        and not spec.trainer.eval_every
        and run.placement.is_chief
    ):
        log.warning(
            "checkpoint.keep_best: %s is evaluated only at the end (trainer.eval_every=0), so the best checkpoint is "
            "the last one; set trainer.eval_every to choose among several",
            objective,
        )
    return TrackObjective(
        objective,
        lower_is_better(objective),
        run.objective_state,
        save_best=run.checkpointer.save_best if spec.checkpoint.keep_best else None,
        patience=patience,
        min_delta=spec.trainer.early_stopping.min_delta,
    )


def resumed_from_topology(run: Run, restored: str, start_step: int) -> Optional[dict]:
    """The topology the restored checkpoint was written under, when it is
    another than this run's (said in the log); a changed global batch is
    refused (engine/topology.py)."""
    spec = run.spec
    return topology.on_resume(
        topology.written_under(restored),
        run.topology,
        batch_size=spec.pipeline.batch_size,
        accumulate_steps=spec.trainer.accumulate_steps,
        scale_lr_with_replicas=spec.optimizer.scale_lr_with_replicas,
        checkpoint=restored,
        run_dir=run.dir,
        start_step=start_step,
        log_it=run.placement.is_chief,
        in_memory=bool(getattr(run.source.train, "same_order_on_any_topology", False))
        and spec.pipeline.service is None,
    )  # the tf.data service shares it out its own way


def start_over_beside_previous_run(run: Run) -> None:
    """A run that is not continued (checkpoint.restore=false, or no checkpoint
    in its dir can be read) starts at step 0 beside the run that was there:
    the chief keeps the old run's files aside instead of writing over them."""
    if run.checkpointer.only_damaged:
        log.warning("no checkpoint in %s can be read: starting from scratch", run.checkpointer.directory)
    if run.placement.is_chief:
        why = (
            "the previous run's files are kept as %s"
            if run.checkpointer.only_damaged
            else "checkpoint.restore=false: the previous run's files are kept as %s"
        )
        for kept in set_aside_previous_run(str(run.dir), run.checkpointer.directory):
            log.warning(why, kept)
    run.checkpointer.start_over()

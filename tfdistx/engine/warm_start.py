"""A warm start (`checkpoint.init_from`): a new run begins at step 0 with
another model's weights and fresh optimizer slots (cf. Model Garden's
init_checkpoint).

The source model is rebuilt outside any strategy (from the source run's own
spec, which core/run_spec.py resolved, or from a Keras file), and its weights
are assigned into this run's strategy-created variables from the
cross-replica context: mirrored and multi-worker replicas each take the
value (every worker loads the same source), and under parameter servers the
coordinator's assignment lands on the ps task that holds the variable.
Variables whose path matches `checkpoint.init_skip` keep their fresh values.
"""

import logging
import os
import re
from typing import List, Optional, Tuple

import keras

from tfdistx.core import warm_start as kinds
from tfdistx.core.errors import EXIT_RUN_DIR_LOCKED, ConfigError, Problem, RunFault, first_line
from tfdistx.engine import checkpointing, process_wide
from tfdistx.engine.build import Run
from tfdistx.engine.parts import build_model, build_optimizer_for, data_facts, model_from_checkpoint

log = logging.getLogger(__name__)

KEY = "checkpoint.init_from"
TRIES = 3  # reads of a source run's newest checkpoint, which a run still training may rotate away meanwhile


def warm_start(run: Run) -> dict:
    """Load the source's weights into the run's model; what was done, for the log and tests."""
    init, skip = run.spec.checkpoint.init_from, run.spec.checkpoint.init_skip
    if (
        init.kind is None
    ):  # left unresolved because the run was to resume (spec.py), but its checkpoints could not be read
        raise ConfigError.for_key(
            KEY,
            init.path,
            f"cannot be read ({kinds.kind(init.path)[1] or 'its run config cannot be resolved'}), "
            "and this run starts afresh: its own checkpoints could not be read (they are kept aside)",
        )
    source, described = _source_weights(run)
    targets = _weights(run.model)
    patterns = [re.compile(pattern) for pattern in skip]
    if len(source) != len(targets):
        raise ConfigError.for_key(
            KEY,
            init.path,
            f"{described} has {len(source)} variables, this run's model {len(targets)}: a warm start "
            "copies them in order, so the models must have the same layers (a layer of another size is fine: "
            "leave it freshly initialised with checkpoint.init_skip=['REGEX'])",
        )
    skipped, differ, used = [], [], set()
    for target, (source_path, value) in zip(targets, source):
        hits = [pattern for pattern in patterns if pattern.search(target.path)]
        if hits:
            skipped.append(target.path)
            used.update(pattern.pattern for pattern in hits)
        elif tuple(target.shape) != tuple(value.shape):
            differ.append(f"{target.path} {tuple(target.shape)} here, {source_path} {tuple(value.shape)} there")
    problems = [
        Problem(
            "checkpoint.init_skip",
            pattern.pattern,
            "matches no variable of this run's model; its variables: "
            + ", ".join(v.path for v in targets[:8])
            + (", ..." if len(targets) > 8 else ""),
        )
        for pattern in patterns
        if pattern.pattern not in used
    ]
    if differ:
        layer = differ[0].split(" ", 1)[0].rsplit("/", 1)[0].rsplit("/", 1)[-1]
        problems.append(
            Problem(
                KEY,
                init.path,
                f"{len(differ)} variable{'s' if len(differ) != 1 else ''} of {described} differ in "
                f"shape from this run's: {'; '.join(differ[:3])}{'; ...' if len(differ) > 3 else ''}. Leave them "
                f"freshly initialised with checkpoint.init_skip=['REGEX'] (e.g. checkpoint.init_skip=['{layer}/'])",
            )
        )
    if problems:
        raise ConfigError(problems)
    with run.strategy.scope():  # the cross-replica context: each assignment reaches every replica's (or the ps') copy
        for target, (_, value) in zip(targets, source):
            if target.path not in skipped:
                target.assign(value)
    slots_for_the_loaded_weights(run)
    loaded = len(targets) - len(skipped)
    log.info(
        "warm start from %s: %d variable%s loaded, %d left freshly initialised%s",
        described,
        loaded,
        "s" if loaded != 1 else "",
        len(skipped),
        f" (checkpoint.init_skip: {', '.join(skipped)})" if skipped else "",
    )
    return {"path": init.path, "source": described, "loaded": loaded, "skipped": skipped}


def slots_for_the_loaded_weights(run: Run) -> None:
    """The optimizer's variables as the class makes them for the weights now
    loaded. Most slots start at zero whatever the weights, but a
    schedule-free optimizer (Keras' ScheduleFreeAdamW) keeps a second set of
    weights, which its build copies from the model's: built before the
    warm start (build.py builds the optimizer with the model), that copy is
    of the freshly initialised weights, and its first step interpolates
    the model back towards them (measured: 0.47 off the source after one
    step). A fresh optimizer is built for the loaded weights and its
    variables copied into the run's: the same class, built alike, so its
    variables come in the same order."""
    with run.strategy.scope():  # the cross-replica context, as the weights were assigned
        fresh = build_optimizer_for(
            run.spec.optimizer, run.spec.trainer.precision, run.model, run.learning_rate, run.train_variables
        )
        for mine, made in zip(run.optimizer.variables, fresh.variables, strict=True):
            mine.assign(made)


def _source_weights(run: Run) -> Tuple[List[Tuple[str, object]], str]:
    """[(path, value)] of the source model's weights, in order, and what the source is."""
    init = run.spec.checkpoint.init_from
    if init.kind in (kinds.RUN, kinds.CHECKPOINT):
        spec = init.spec or run.spec  # a bare checkpoint is read as this run's model
        if init.kind == kinds.RUN:
            path, model = newest_restored(spec, init.path)
        else:
            path = os.path.expanduser(init.path)
            try:
                model = restored(spec, path, init.path, into="its run" if init.spec else "this run")
            except Vanished:
                raise RunFault(
                    f"{KEY}={init.path!r}: was removed while it was read (its run, still training, keeps only its "
                    "checkpoint.max_to_keep newest): name that run's directory, for its newest checkpoint, or one it "
                    f"keeps (exit {EXIT_RUN_DIR_LOCKED})",
                    EXIT_RUN_DIR_LOCKED,
                ) from None
        described = (
            f"{os.path.basename(path)} of {init.spec.run_dir if init.spec else 'a checkpoint read as this run'}'s model"
        )
    else:
        described = f"{os.path.basename(init.path)}"
        model = _keras_model(init.path) if init.kind == kinds.KERAS else _model_with_weights_file(run, init.path)
    return [(variable.path, variable.numpy()) for variable in _weights(model)], described


def _keras_model(path: str):
    try:
        return keras.saving.load_model(os.path.expanduser(path), compile=False)
    except Exception as error:
        raise ConfigError.for_key(KEY, path, f"cannot be loaded: {first_line(error)}") from None


def _model_with_weights_file(run: Run, path: str):
    """A .weights.h5 file's weights in a model built as this run's is (afresh, outside the strategy)."""
    feature_spec, label_spec = run.source.element_spec
    with process_wide.precision("float32"):  # the file holds float32 weights, whatever the run computes in
        model = build_model(
            run.spec.model,
            run.spec.data,
            feature_spec,
            run.task.num_outputs(label_spec, run.source.num_classes),
            **data_facts(run.spec.model, run.source),
        )
    try:
        model.load_weights(os.path.expanduser(path))
    except Exception as error:
        raise ConfigError.for_key(
            KEY,
            path,
            f"cannot be loaded into this run's model: {_other_weights(path, model) or first_line(error)}; "
            "a .weights.h5 is read as this run's model: give one saved from a model built as this run's is, "
            "or a .keras file (it brings its own model)",
        ) from None
    return model


class Vanished(Exception):
    """A checkpoint whose files were removed while it was read: its run, still
    training, rotated it away (CheckpointManager's max_to_keep)."""


def restored(spec, path: str, given: str, into: str):
    """The model `spec` builds with checkpoint `path` restored into it
    whole; Vanished, or a ConfigError naming `given` (the user's init_from)."""
    try:
        model, _, _, status = model_from_checkpoint(spec, path)
        # Every variable of the rebuilt model must get a value (never a silently random one); the
        # checkpoint's step, RNG states and optimizer slots are its run's, not the warm start's.
        status.assert_existing_objects_matched()
        status.expect_partial()
        return model
    except ConfigError:
        raise
    except Exception as error:
        if not os.path.exists(f"{path}.index"):  # a rotated checkpoint loses its .index first
            raise Vanished(path) from None
        raise ConfigError.for_key(
            KEY, given, f"{os.path.basename(path)} cannot be restored into {into}'s model: {first_line(error)}"
        ) from None


def newest_restored(spec, given: str, restore=restored) -> Tuple[str, object]:
    """(the newest checkpoint of the run `spec` describes, its model). The
    run may still be training: a checkpoint it rotates away while it is read
    is not a bad config; the newest is taken again, a few times, before a
    RunFault (exit 7, as for a run directory another run holds: a later try
    can succeed). `restore`: restored, or a test's way to rotate one away first."""
    gone = []
    for _ in range(TRIES):
        path = checkpointing.find(spec.checkpoint.dir)
        try:
            return path, restore(spec, path, given, "its run")
        except Vanished:
            gone.append(os.path.basename(path))
            log.warning(
                "warm start: %s was removed while it was read (its run is still training); taking the newest again",
                path,
            )
    raise RunFault(
        f"{KEY}={given!r}: its newest checkpoint was removed while it was read, {TRIES} times ({', '.join(gone)}): "
        "that run is still training and rotates its checkpoints away (checkpoint.max_to_keep). Run again, or give one "
        f"it keeps (RUN/checkpoints/best/ckpt-N, with checkpoint.keep_best) (exit {EXIT_RUN_DIR_LOCKED})",
        EXIT_RUN_DIR_LOCKED,
    )


def _other_weights(path: str, model) -> Optional[str]:
    """What differs between a .weights.h5 file's arrays and `model`'s
    weights, when they differ in number or shapes (Keras' own error names
    one object, not what is wrong)."""
    import h5py  # deferred: only for a refused file (Keras' own dependency, which writes .weights.h5)

    try:
        with h5py.File(os.path.expanduser(path), "r") as weights_file:
            there = []
            weights_file.visititems(
                lambda _, item: there.append(tuple(item.shape)) if isinstance(item, h5py.Dataset) else None
            )
    except Exception:  # unreadable: Keras' own words say so
        return None
    here = [tuple(v.shape) for v in _weights(model)]
    if sorted(there) == sorted(here):
        return None
    listed = lambda shapes: ", ".join(map(str, shapes[:4])) + (", ..." if len(shapes) > 4 else "")  # noqa: E731
    return f"it holds {len(there)} arrays ({listed(there)}), this run's model {len(here)} ({listed(here)})"


def _weights(model) -> list:
    """The model's weights in order; the dropout RNG states are not weights:
    they stay as this run's trainer.seed made them. Matched by position, not
    by path: Keras numbers layer names per process (dense, dense_1, ...), so
    the same builder gives other paths each time it runs in one process."""
    return [v for v in model.weights if not v.path.endswith("seed_generator_state")]

"""Embedding tables split by hand into row shards (models.ShardedEmbedding:
one shard per parameter server, `model.shards: ${cluster.ps}`), re-split
when a run resumes with another number of them (another topology).

A checkpoint of such a table holds its shards as separate variables, and
the optimizer's slots (Adam's moments) likewise, so a run with another
number of shards cannot restore it as it is. Here the checkpoint's model
and optimizer are restored into a copy of the model built with the
checkpoint's number of shards, every table and slot is put back together
and cut into this run's shards, and the result is written as a checkpoint
of this run's layout, which the run then restores as usual. All of it
outside any strategy, on this process's own devices.
"""

import logging
import math
import os
import tempfile
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from tfdistx.internals import tensorflow as internals

log = logging.getLogger(__name__)


def tables(model) -> list:
    """The model's layers that hold a table split by rows (`tables`, `vocab_size`, `rows`, `shards`)."""
    return [layer for layer in _leaves(model) if _is_table(layer)]


class Resplit:
    """`rebuild(shards)`: this run's model and optimizer, built outside any
    strategy, with its tables in `shards` pieces (None: as configured)."""

    def __init__(self, model, rebuild: Callable[[Optional[int]], tuple]):
        self.model, self.rebuild = model, rebuild

    def saved_shards(self, path: str) -> Optional[int]:
        """How many shards the checkpoint's tables are in, when not as many
        as this model's; None when the same (or there is nothing to tell by).
        Read from the shape of the first table's first shard, where the
        optimizer's checkpoint keeps the model's variables in order."""
        first = tables(self.model)[0]
        index = next(i for i, v in enumerate(self.model.trainable_variables) if v is first.tables[0])
        try:
            shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
        except Exception:  # unreadable: the restore says so
            return None
        shape = shapes.get(internals.saved_trainable_variable_key(index))
        if not shape or len(shape) != 2 or shape[0] < 1:
            return None
        saved = math.ceil(first.vocab_size / shape[0])
        return saved if saved != first.shards and shape[0] != first.rows else None

    def convert(self, path: str, shards: int, into: str) -> str:
        """The checkpoint's model and optimizer, re-split into this run's
        shards, written under `into`; its path. ValueError (or TensorFlow's
        assertion) when the checkpoint is not of this model after all."""
        donor, donor_optimizer = self.rebuild(shards)
        status = tf.train.Checkpoint(model=donor, optimizer=donor_optimizer).read(path)
        status.assert_existing_objects_matched()  # every variable of the donor found, in its shape
        status.expect_partial()  # the step, the objective: restored by the run itself
        model, optimizer = self.rebuild(None)
        _copy(donor, donor_optimizer, model, optimizer)
        return tf.train.Checkpoint(model=model, optimizer=optimizer).write(os.path.join(into, "resplit"))


def restore(parts: dict, path: str, resplit: Optional[Resplit]):
    """`tf.train.Checkpoint(**parts).restore(path)` (its status), or, when that
    fails on a checkpoint whose tables are in another number of shards, the
    restore of it re-split (a model rebuilt outside the run: the export, a
    warm start)."""
    try:
        return tf.train.Checkpoint(**parts).restore(path)
    except (ValueError, tf.errors.OpError) as error:  # shapes that do not fit: "Received incompatible tensor"
        saved, mismatch = resplit.saved_shards(path) if resplit else None, error
        if not saved:
            raise
    with tempfile.TemporaryDirectory(prefix="tfdistx-resplit-") as scratch:
        try:
            status = tf.train.Checkpoint(**parts).read(resplit.convert(path, saved, scratch))
            status.assert_existing_objects_matched()  # read now, while the converted files are there
        except Exception:  # not a re-split after all (another vocab_size, say): the first error says what differs
            raise mismatch from None
    log.info(
        "%s: its embedding tables were saved in %d shard(s) and are re-split into %d (model.shards)",
        os.path.basename(path),
        saved,
        tables(resplit.model)[0].shards,
    )
    return status


def _leaves(layer):
    inner = getattr(layer, "layers", None)
    if inner:
        for child in inner:
            yield from _leaves(child)
    else:
        yield layer


def _is_table(layer) -> bool:
    return all(hasattr(layer, name) for name in ("tables", "vocab_size", "rows", "shards"))


def _copy(donor, donor_optimizer, model, optimizer) -> None:
    """Every value of `donor` and its optimizer into `model` and its
    optimizer: tables and their slots re-split, the rest as they are."""
    pairs = []  # (variable here, its donor variables, how their values make its value)
    for there, here in zip(_leaves(donor), _leaves(model)):
        if _is_table(here) and there.shards != here.shards:
            pairs += [
                (table, list(there.tables), _piece(here.vocab_size, here.rows, k))
                for k, table in enumerate(here.tables)
            ]
        elif len(there.weights) == len(here.weights):
            pairs += [(mine, [theirs], _whole) for mine, theirs in zip(here.weights, there.weights)]
        else:
            raise ValueError(
                f"layer {here.name} has {len(here.weights)} weights here and {len(there.weights)} in the checkpoint"
            )
    covered = {id(variable) for variable, _, _ in pairs}
    outside = [v.path for v in model.weights if id(v) not in covered]
    if outside:
        raise ValueError(f"weights outside the model's layers: {', '.join(outside[:3])}")
    for variable, sources, make in pairs:
        variable.assign(make([source.numpy() for source in sources]))
    # Each optimizer (a loss-scale optimizer, then the one inside) keeps slots
    # per variable, in lists (Adam's _momentums, _velocities); its other
    # values (iterations, the loss scale) do not depend on the split.
    for there, here in zip(_optimizers(donor_optimizer), _optimizers(optimizer)):
        slots_there, slots_here = internals.slot_lists(there), internals.slot_lists(here)
        if slots_there.keys() != slots_here.keys():
            raise ValueError(f"the optimizers differ: slots {sorted(slots_there)} and {sorted(slots_here)}")
        for name, lists in slots_here.items():
            for variable, sources, make in pairs:
                if variable.trainable:
                    slot = lists[internals.slot_index(here, variable)]
                    slot.assign(make([slots_there[name][internals.slot_index(there, s)].numpy() for s in sources]))
        rest_there, rest_here = _others(there, slots_there), _others(here, slots_here)
        if len(rest_there) != len(rest_here):
            raise ValueError(f"the optimizers differ: {len(rest_there)} values there, {len(rest_here)} here")
        for mine, theirs in zip(rest_here, rest_there):
            mine.assign(theirs.numpy())


def _whole(values):
    return values[0]


def _piece(vocab_size: int, rows: int, k: int):
    """Rows [k rows, (k+1) rows) of the whole table (its ids < vocab_size),
    padded with zeros where the last shard runs past the ids."""

    def make(values):
        whole = np.concatenate(values)[:vocab_size]
        piece = whole[k * rows : (k + 1) * rows]
        if len(piece) < rows:
            piece = np.concatenate([piece, np.zeros((rows - len(piece), *piece.shape[1:]), piece.dtype)])
        return piece

    return make


def _optimizers(optimizer) -> list:
    inner = getattr(optimizer, "inner_optimizer", None)
    return [optimizer] + (_optimizers(inner) if inner is not None else [])


def _others(optimizer, slots: dict) -> list:
    taken = {id(v) for values in slots.values() for v in values}
    return [v for v in internals.own_variables_of(optimizer) if id(v) not in taken]

"""Keras 3 training on variables that `strategy.partitioner` split across the ps tasks.

ParameterServerStrategy's `variable_partitioner` turns each large variable
into a ShardedVariable (its rows in shards, one per ps task, round-robin).
Keras 3 builds layers on it (the forward pass reads it through TF's
concatenation of the shards), but with TF 2.21 and Keras 3.15.1 it can neither
train nor save one (measured):

- `tape.gradient` asks the Keras variable for `.handle`:
  "'ShardedVariable' object has no attribute 'handle'";
- the optimizer makes each slot "colocated with" its variable, and a
  ShardedVariable has no one device: both Adam slots of a sharded kernel
  land whole on the coordinator (`/job:chief`), not on the ps tasks;
- tf.train.Checkpoint: "'ShardedVariable' object has no attribute
  'device'" (Keras hands TF the ShardedVariable as one tensor to save).

So the model keeps its ShardedVariables (model code unchanged) and here:

- the optimizer is built on, and the loop differentiates by, one Keras
  variable per shard (`train_variables`): each shard is a plain variable on
  its ps, its slots are made beside it, and a sparse embedding gradient
  stays sparse per shard;
- every sharded variable saves as ONE tensor, each shard written as a slice
  of it (`own_shards`), and the checkpoint holds the optimizer in the shape an
  unsplit run saves (`OptimizerState`): the same keys and full shapes. A
  checkpoint therefore restores onto any number of ps tasks (re-split), with
  the partitioner on or off, and the export builds the model unsplit.
"""

import keras

from tfdistx.internals import tensorflow as internals


def is_sharded(variable) -> bool:
    """A Keras variable whose TF variable the partitioner split."""
    return internals.is_sharded_variable(getattr(variable, "value", None))


def own_shards(model) -> bool:
    """Make every sharded variable of `model` save as TF saves a
    ShardedVariable: one tensor of its full shape, each shard a slice of it,
    which a restore onto other shards (or none) reads its own part of. True
    when the model has any.

    Keras' variable would hand TF the ShardedVariable as one tensor, so each
    such variable is made to save as its ShardedVariable does (the internals
    say how)."""
    found = False
    for variable in model.weights:
        if is_sharded(variable):
            internals.save_as_slices(variable)
            found = True
    return found


def groups(model) -> list:
    """The model's trainable variables as the checkpoint sees them, in order:
    (what is saved, [what the optimizer updates]). A variable the
    partitioner split is saved as itself and updated shard by shard; any
    other variable is both."""
    out = []
    for variable in model.trainable_variables:
        if is_sharded(variable):
            # A Keras variable given a tf.Variable wraps it (no copy); named after its variable and shard.
            out.append(
                (
                    variable,
                    [
                        keras.Variable(part, trainable=True, name=f"{variable.path.replace('/', '_')}_part_{i}")
                        for i, part in enumerate(variable.value.variables)
                    ],
                )
            )
        else:
            out.append((variable, [variable]))
    return out


def split(model) -> bool:
    """Whether the partitioner split any of the model's trainable variables."""
    return any(is_sharded(v) for v in model.trainable_variables)


def train_variables(model_groups: list) -> list:
    """The variables the optimizer updates and the loop differentiates by."""
    return [v for _, parts in model_groups for v in parts]


class OptimizerState(internals.FixedChildren):
    """What the checkpoint holds for an optimizer built on `train_variables`:
    exactly the keys of the optimizer an unsplit run builds on the model's
    variables (`_iterations`, `_trainable_variables/N`, `_variables/N` ...),
    each slot of a split variable one ShardedVariable of its shards' slots,
    saved whole. Restored into here, the values land in the optimizer's own
    shard slots; the export's optimizer (unsplit) restores it as it is."""

    def __init__(self, optimizer, model_groups: list):
        variables = train_variables(model_groups)
        logical = [whole for whole, _ in model_groups]
        own = list(optimizer.variables)
        # Each slot goes to the variable with the longest prefix of its name that Keras gives that
        # variable's slots; the optimizer's own (iterations ...) to none.
        prefixes = {id(v): internals.slot_name_prefix(v) for v in variables}
        slots_of = {id(v): [] for v in variables}
        first = len(own)
        for index, slot in enumerate(own):
            owner = max(
                (v for v in variables if slot.name.startswith(prefixes[id(v)])),
                key=lambda v: len(prefixes[id(v)]),
                default=None,
            )
            if owner is not None:
                slots_of[id(owner)].append(slot)
                first = min(first, index)
        per = {len(s) for s in slots_of.values()}
        if len(per) != 1 or first + sum(map(len, slots_of.values())) != len(own):
            raise ValueError(f"tfdistx cannot checkpoint the slots of {type(optimizer).__name__} on split variables")
        per = per.pop()
        grouped = []
        for _, parts in model_groups:
            slots = [slots_of[id(v)] for v in parts]
            grouped += (
                [internals.sharded_variable([s[k].value for s in slots]) for k in range(per)]
                if len(parts) > 1
                else slots[0]
            )
        # Every other child of the optimizer as it is (its iterations, learning rate ...); its lists and
        # dicts (momentums, velocities, indices) hold the per-shard slots again, or nothing to save.
        others = internals.checkpoint_children(optimizer)
        variables_list = own[:first] + grouped
        super().__init__(
            {
                **others,
                internals.OPTIMIZER_TRAINABLE_VARIABLES: internals.tracked(logical),
                internals.OPTIMIZER_VARIABLES: internals.tracked(variables_list),
            }
        )
        self._variables_list = variables_list

    @property
    def variables(self) -> list:
        """As the optimizer's `variables`: what a mismatch message counts."""
        return list(self._variables_list)

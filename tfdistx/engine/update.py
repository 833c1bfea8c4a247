"""One optimizer step on one replica: gradients, their sum over replicas, the update.

tfdistx sums the gradients over replicas itself (one all-reduce, as Keras
would) and then hands them to the optimizer, built to expect them summed
(optim.py). Keras 3 sums them only inside its update, after two decisions
that must see the sum:
- it clips (`clipnorm`, `global_clipnorm`) before it sums, so it would clip
  each replica's share and train differently on 1 and on 2 replicas;
- its LossScaleOptimizer asks "are the gradients finite?" of one replica's
  unsummed share, so replicas can disagree about skipping a step, and a
  synchronous cluster then waits forever in the sum the skipping one never
  joins.
Summed first, every replica holds the same gradients: clipping is the global
batch's, and every replica takes the same branch.

Accumulation (`trainer.accumulate_steps=N`): a step's batch is N
micro-batches; their gradients are added up before the one sum over replicas
and the one update. That is one batch N times larger, with the activations of
one micro-batch in memory.

XLA (`trainer.jit_compile`): with one replica whose variables live on the
device that computes (one_device: the strategy table's `xla_whole_step`),
the whole step is one XLA computation — every micro-batch's forward and
backward pass, the sum, the optimizer's update and the metrics' state — as
Keras `fit` compiles its train step: on small models the update's many
small kernels (one per variable and slot) are most of the step, and XLA
fuses them. Elsewhere the forward and backward pass of a micro-batch is
compiled, and the sum over replicas and the update stay outside it, where
the collectives and variable placement of every strategy work unchanged.

BatchNormalization's moving mean and variance: a replica updates its own
copy from its own batch (Keras 3 creates them with no aggregation), so the
copies would drift apart, and the workers of a cluster end with different
weights, a checkpoint holding the first replica's. tf.keras declared them
averaged over the replicas on read (synchronization ON_READ, aggregation
MEAN); here each replica's updated copy joins the step's one sum over
replicas, beside the gradients, and every replica takes their mean. A
moving average being linear in what it adds, that is the mean tf.keras
read, and every replica (every worker) holds it after every step:
evaluation, checkpoints and the export see one value. A layer made with
`synchronized=True` normalizes by the global batch's statistics already,
so its copies agree and are not averaged again (docs/multi-process.md).

Steps per XLA call (`trainer.steps_per_xla_call`): compiled whole, K
consecutive steps can be one XLA computation. Each call of a compiled
computation has a fixed cost on a CPU beyond its arithmetic, a large part
of a small model's step (docs/performance.md: XLA on CPUs). The K batches
are stacked and a loop inside the computation takes them in turn, so it
compiles as one step does whatever K (unrolled, its compile time would
grow with K).
The steps are the same ops in the same order: the weights are bitwise
those of K=1.
"""

import warnings
from typing import Callable, List, Optional, Sequence

import keras
import tensorflow as tf

from tfdistx.engine.all_reduce_dtype import cast_back, cast_down
from tfdistx.engine.optim import LearningRateAtStep
from tfdistx.internals import tensorflow as internals
from tfdistx.core.errors import first_line
from tfdistx.tasks import traced


class Update:
    def __init__(
        self,
        task,
        model,
        optimizer,
        global_batch: int,
        accumulate_steps: int = 1,
        jit_compile: bool = False,
        all_reduce_options=None,
        whole_step: bool = False,
        all_reduce_dtype=None,
        variables=None,
        learning_rate: Optional[LearningRateAtStep] = None,
        steps_per_xla_call: int = 1,
        gradient_sum: Optional[Callable[[Sequence[tf.Tensor]], Sequence[tf.Tensor]]] = None,
    ):
        """`global_batch`: examples per step over all replicas (all micro-batches);
        `all_reduce_options`: tf.distribute CommunicationOptions for the sum (strategy.py);
        `whole_step`: with `jit_compile`, XLA compiles the whole step, update included
        (only where the strategy's one replica computes beside its variables);
        `variables`: what the gradients are taken by and the optimizer updates, when not the
        model's trainable variables (the shards of partitioned ones: sharding.py);
        `learning_rate`: the optimizer's, told each step's number;
        `steps_per_xla_call`: steps in one compiled computation (only with the whole step compiled);
        `gradient_sum`: what sums the gradients over the replicas instead of the strategy's
        all-reduce (MPI's, engine/mpi.py)."""
        self.task, self.model, self.optimizer = task, model, optimizer
        self.statistics = replica_statistics(model)  # averaged over the replicas after each step (above)
        self.variables, self.learning_rate = variables, learning_rate
        self.global_batch, self.accumulate_steps = global_batch, accumulate_steps
        self.all_reduce_options = all_reduce_options
        self.gradient_sum = gradient_sum
        self.all_reduce_dtype = all_reduce_dtype  # strategy.all_reduce_dtype (strategy.py); None: the variables' dtype
        self.whole_step = bool(jit_compile and whole_step)
        self.steps_per_call = max(1, int(steps_per_xla_call)) if self.whole_step else 1
        self._forward, self._loss = traced(task, "forward"), traced(task, "loss")
        partly = jit_compile and not self.whole_step
        # Without AutoGraph, as the step runner's loop (runner.py): the loops here are tf.while_loops.
        self._gradients = (
            tf.function(self._gradients_fn, jit_compile=True, autograph=False) if partly else self._gradients_fn
        )
        self._one = tf.function(self._one_fn, jit_compile=True, autograph=False) if self.whole_step else self._one_fn
        self._many = tf.function(self._many_fn, jit_compile=True, autograph=False) if self.steps_per_call > 1 else None

    def xla_failure(self, batch_spec, metric_state: Callable, state_spec: tf.TensorSpec) -> Optional[str]:
        """Why XLA cannot compile what this update compiles (None: it can, or
        nothing is compiled), found by lowering it to XLA's HLO for a batch of
        `batch_spec` (one replica's), without running it: no variable changes
        and no batch is read. Lowered for specs, not values: given a tensor,
        XLA takes as a constant any input a shape depends on (a bincount's
        size), and compiles again for every new value. The compiled function
        is traced as the step runner calls it (`metric_state`: the same
        object; `state_spec`: its sum's), so the step is traced once for both."""
        if self._many is not None:
            spec = tf.nest.map_structure(lambda s: tf.TensorSpec([self.steps_per_call, *s.shape], s.dtype), batch_spec)
            call = lambda batch, step, zeros: self._many(batch, step, metric_state, zeros)  # noqa: E731
        elif self.whole_step:
            spec = batch_spec
            call = lambda batch, step, zeros: self._one(batch, step, metric_state)  # noqa: E731
        elif self._gradients is not self._gradients_fn:
            spec = tf.nest.map_structure(
                lambda s: tf.TensorSpec([s.shape[0] // self.accumulate_steps, *s.shape[1:]], s.dtype), batch_spec
            )
            call = lambda batch, step, zeros: self._gradients(batch)  # noqa: E731
        else:
            return None
        # Its arguments all specs (as experimental_get_compiler_ir takes them): the batch flattened.
        lowered = tf.function(
            lambda step, zeros, *parts: call(tf.nest.pack_sequence_as(spec, parts), step, zeros),
            jit_compile=True,
            autograph=False,
        )
        args = (tf.TensorSpec([], tf.int64), state_spec, *tf.nest.flatten(spec))
        lowered.get_concrete_function(
            *args
        )  # a step that cannot even be traced fails here, as it would at its first step
        # Named, the device is not looked up by TensorFlow with a random number (which would draw one);
        # device_name is deprecated in favour of platform_name, which looks it up all the same.
        device = tf.zeros([]).device
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", category=UserWarning)
                lowered.experimental_get_compiler_ir(*args)(stage="hlo", device_name=device)
        except (
            ValueError,
            tf.errors.OpError,
        ) as error:  # "Failed getting HLO text: ...", "Detected unsupported operations ..."
            return _xla_reason(error)
        return None

    def without_xla(self) -> None:
        """Compile nothing from now on: the step of `jit_compile=False` (for a step XLA cannot compile)."""
        self.whole_step, self.steps_per_call = False, 1
        self._gradients, self._one, self._many = self._gradients_fn, self._one_fn, None

    def __call__(self, batches: Sequence, first_step: tf.Tensor, metric_state: Callable, zeros: tf.Tensor) -> tf.Tensor:
        """Train on this replica's `batches`, one step each (steps `first_step`,
        `first_step` + 1, ...: at most `steps_per_call` of them); returns the sum over
        their micro-batches of `metric_state(labels, outputs, per_example_loss)`,
        and for several batches that sum in float64, from `zeros`."""
        if len(batches) == 1:
            return self._one(batches[0], first_step, metric_state)
        stacked = tf.nest.map_structure(lambda *parts: tf.stack(parts), *batches)
        return self._many(stacked, first_step, metric_state, zeros)

    def _one_fn(self, batch, step, metric_state: Callable) -> tf.Tensor:
        if self.learning_rate is not None:
            # The schedule follows the loop's own step, not optimizer.iterations,
            # which concurrent parameter-server workers undercount.
            self.learning_rate.step = step
        return self._step_fn(batch, metric_state)

    def _many_fn(self, stacked, first_step, metric_state: Callable, zeros: tf.Tensor) -> tf.Tensor:
        def add_step(k, total):
            batch = tf.nest.map_structure(lambda t: tf.gather(t, k), stacked)
            # Added in float64, as the loop adds one step's state to the next (runner.py): the sums of K=1.
            return total + tf.cast(self._one_fn(batch, first_step + tf.cast(k, tf.int64), metric_state), tf.float64)

        steps = tf.shape(tf.nest.flatten(stacked)[0])[0]
        _, total = tf.while_loop(
            lambda k, _: k < steps, lambda k, total: (k + 1, add_step(k, total)), (tf.constant(0), zeros)
        )
        return total

    def _step_fn(self, batch, metric_state: Callable) -> tf.Tensor:
        variables = self.model.trainable_variables if self.variables is None else self.variables
        micro_batches = _split(batch, self.accumulate_steps)
        # The first micro-batch outside the loop: which gradients are None
        # (variables the loss does not reach) is known once it is traced.
        grads, labels, outputs, per_example = self._gradients(micro_batches(0))
        state = metric_state(labels, outputs, per_example)
        if self.accumulate_steps > 1:
            present = [i for i, g in enumerate(grads) if g is not None]
            sums = [grads[i] for i in present]
            # Sparse gradients (embedding rows) are added by listing their rows
            # together, so they stay sparse; they grow with every micro-batch,
            # which only an unrolled loop allows.
            sparse = any(isinstance(g, tf.IndexedSlices) for g in sums)

            def add_micro_batch(k, sums, state):
                more, labels, outputs, per_example = self._gradients(micro_batches(k))
                return [_add(total, more[i]) for total, i in zip(sums, present)], state + metric_state(
                    labels, outputs, per_example
                )

            if sparse:
                for k in range(1, self.accumulate_steps):
                    sums, state = add_micro_batch(k, sums, state)
            else:
                _, sums, state = tf.while_loop(
                    lambda k, *_: k < self.accumulate_steps,
                    lambda k, sums, state: (k + 1, *add_micro_batch(k, sums, state)),
                    (tf.constant(1), sums, state),
                )
            grads = [None] * len(grads)
            for i, total in zip(present, sums):
                grads[i] = total
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        # strategy.all_reduce_dtype: summed in 16 bits (half the bytes
        # to move), back in the variables' dtype for the optimizer
        sent = (
            [cast_down(g, self.all_reduce_dtype) for g, _ in pairs] if self.all_reduce_dtype else [g for g, _ in pairs]
        )
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        # This replica's copies of the moving statistics, updated by its batch: averaged over the replicas.
        averaged = self.statistics if replicas > 1 else []
        statistics = [_read_on_its_device(v) for v in averaged]
        if self.gradient_sum is not None:  # MPI sums one dtype at a time
            summed = self.gradient_sum(sent)
            statistics = self.gradient_sum(statistics) if statistics else []
        else:
            summed = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, sent + statistics, options=self.all_reduce_options
            )
            summed, statistics = summed[: len(sent)], summed[len(sent) :]
        if self.all_reduce_dtype:
            summed = [cast_back(s, g, v) for s, (g, v) in zip(summed, pairs)]
        self.optimizer.apply_gradients(zip(summed, [v for _, v in pairs]))
        for variable, total in zip(averaged, statistics):
            variable.assign(total / tf.cast(replicas, total.dtype))
        return state

    def _gradients_fn(self, batch):
        """Gradients of one micro-batch's share of the global mean loss."""
        variables = self.model.trainable_variables if self.variables is None else self.variables
        with tf.GradientTape() as tape:
            labels, outputs = self._forward(self.model, batch, training=True)
            per_example = self._loss(labels, outputs)
            # Scaled by the whole step's global batch: the micro-batches and replicas are summed.
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=self.global_batch)
            if self.model.losses:  # once per step, shared by the replicas and micro-batches
                loss += tf.nn.scale_regularization_loss(tf.add_n(self.model.losses)) / self.accumulate_steps
            scaled = self.optimizer.scale_loss(loss)  # mixed_float16: times the loss scale; else the loss
        return tape.gradient(scaled, variables), labels, outputs, per_example


def replica_statistics(model) -> List:
    """The moving statistics of the model's BatchNormalization layers that
    each replica keeps a copy of (a mirrored variable without aggregation;
    not `synchronized=True`, whose copies agree). Averaged only where a
    step has more than one replica (_step_fn)."""
    found = []
    for layer in internals.sublayers(model, include_self=True, recursive=True):
        if not isinstance(layer, keras.layers.BatchNormalization) or layer.synchronized:
            continue
        for variable in layer.non_trainable_variables:
            value = variable.value if isinstance(variable, keras.Variable) else variable
            if (
                isinstance(value, tf.distribute.DistributedValues)
                and value.aggregation == tf.VariableAggregation.NONE
                and value.synchronization != tf.VariableSynchronization.ON_READ
            ):
                found.append(variable)
    return found


def _read_on_its_device(variable) -> tf.Tensor:
    """This replica's copy of `variable`, read on its device: a multi-worker
    all-reduce sends each tensor from the device it names, and a read inside
    the step names none (`destinations can not be empty`)."""
    with tf.device(variable.value.device):
        return tf.identity(variable.value)


def _xla_reason(error: Exception) -> str:
    """What XLA said, without the wrapper TensorFlow puts around it."""
    return first_line(error).removeprefix("Failed getting HLO text: ").strip("'")


def _add(total, more):
    if isinstance(total, tf.IndexedSlices):  # rows listed twice add up when applied (scatter-add)
        return tf.IndexedSlices(
            tf.concat([total.values, more.values], 0), tf.concat([total.indices, more.indices], 0), total.dense_shape
        )
    return total + more


def _split(batch, parts: int) -> Callable:
    """micro_batch(k): the k-th of `parts` equal slices of every tensor in `batch`.

    Each tensor is reshaped once to [parts, micro-batch, ...] and indexed at
    k, so a micro-batch's shape is known when the step is compiled, even at
    a k that a loop counts. Sliced at k instead (t[k * size:(k + 1) * size]),
    its size is not, and XLA compiled the step for a shape of any size,
    several times slower than indexed (docs/performance.md: accumulation)."""
    if parts == 1:
        return lambda k: batch
    split = tf.nest.map_structure(lambda t: _in_parts(t, parts), batch)
    return lambda k: tf.nest.map_structure(lambda t: t[k], split)


def _in_parts(tensor: tf.Tensor, parts: int) -> tf.Tensor:
    """`tensor` as [parts, its rows / parts, ...] (static where its shape is: batches are cut with drop_remainder)."""
    shape = tensor.shape
    if shape.is_fully_defined():
        return tf.reshape(tensor, [parts, shape[0] // parts, *shape[1:]])
    return tf.reshape(tensor, tf.concat([[parts, -1], tf.shape(tensor)[1:]], 0))

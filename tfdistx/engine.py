"""The training engine: one custom training loop for every strategy.

Keras 3 `model.fit` cannot drive multi-worker or parameter-server strategies
(see shared FACTS.md), so tfdistx owns the loop: a tf.function runs up to
`steps_per_loop` steps per call, each step a `strategy.run` of forward,
backward and the optimizer's all-reduced update, and per-replica loss and
accuracy sums are reduced across replicas.

The engine knows nothing of Hydra: it takes built objects, so a notebook or a
test can drive it directly.
"""

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import keras
import tensorflow as tf

from tfdistx.checkpointing import Checkpointer

Metrics = Dict[str, float]


@dataclass
class Schedule:
    """When things happen, in optimizer steps."""

    steps: int
    steps_per_loop: int = 100
    log_every: int = 100
    eval_every: int = 0  # 0: only at the end

    def next_stop(self, step: int, checkpoint_every: int = 0) -> int:
        """The next step at which the loop must come back to Python."""
        stops = [self.steps, step + self.steps_per_loop, _next_multiple(step, self.log_every)]
        for every in (self.eval_every, checkpoint_every):
            if every:
                stops.append(_next_multiple(step, every))
        return min(stops)


@dataclass
class Result:
    step: int
    train: Metrics = field(default_factory=dict)
    eval: Metrics = field(default_factory=dict)
    examples_per_sec: float = 0.0
    wall_time_sec: float = 0.0


class Trainer:
    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        train_data,
        global_batch: int,
        schedule: Schedule,
        eval_data=None,
        checkpointer: Optional[Checkpointer] = None,
        loggers: List[Callable[[int, Metrics], None]] = (),
        coordinator=None,
        workers: int = 1,
        preemption=None,
        step_counter: Optional[tf.Variable] = None,
    ):
        """`coordinator`: a ClusterCoordinator for parameter-server training.
        Then steps are scheduled on the workers asynchronously, and
        `eval_data` is a plain dataset evaluated here, on the coordinator."""
        self.strategy, self.model, self.optimizer = strategy, model, optimizer
        self.train_data, self.eval_data = train_data, eval_data
        self.global_batch, self.schedule = global_batch, schedule
        self.checkpointer, self.loggers = checkpointer, list(loggers)
        self.coordinator, self.workers = coordinator, workers
        self.preemption = preemption  # a PreemptionWatcher: checked after every loop call
        # Steps completed, as the loop counts them, saved with the checkpoint.
        # Not optimizer.iterations: parameter-server workers increment that
        # concurrently and lose increments (measured: 319 after 400 steps).
        self.step_counter = step_counter if step_counter is not None else optimizer.iterations
        self._train_loop = tf.function(self._train_loop_fn)
        self._evaluate = tf.function(self._evaluate_on_coordinator_fn if coordinator else self._evaluate_fn)

    @property
    def step(self) -> int:
        return int(self.step_counter.numpy())

    # -- traced code -------------------------------------------------------

    def _replica_totals(self, logits, labels, per_example_loss):
        """Per-replica sums: loss, correct predictions, examples."""
        labels = tf.cast(tf.reshape(labels, [-1]), tf.int64)
        correct = tf.equal(tf.argmax(logits, axis=-1), labels)
        return tf.stack([
            tf.reduce_sum(per_example_loss),
            tf.reduce_sum(tf.cast(correct, tf.float32)),
            tf.cast(tf.size(labels), tf.float32),
        ])

    def _train_step(self, batch):
        features, labels = batch
        with tf.GradientTape() as tape:
            logits = self.model(features, training=True)
            per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            # Scale by the global batch: the optimizer sums gradients over replicas.
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=self.global_batch)
            if self.model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(self.model.losses))
        variables = self.model.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return self._replica_totals(logits, labels, per_example)

    def _train_loop_fn(self, iterator, num_steps):
        totals = tf.zeros([3])
        for _ in tf.range(num_steps):
            per_replica = self.strategy.run(self._train_step, args=(next(iterator),))
            totals += self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return totals

    def _eval_step(self, batch):
        features, labels = batch
        logits = self.model(features, training=False)
        per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        return self._replica_totals(logits, labels, per_example)

    def _evaluate_on_coordinator_fn(self, dataset):
        totals = tf.zeros([3])
        for batch in dataset:
            totals += self._eval_step(batch)
        return totals

    def _evaluate_fn(self, dataset):
        totals = tf.zeros([3])
        for batch in dataset:
            per_replica = self.strategy.run(self._eval_step, args=(batch,))
            totals += self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return totals

    # -- the loop ----------------------------------------------------------

    def evaluate(self) -> Metrics:
        if self.eval_data is None:
            return {}
        loss, correct, count = self._evaluate(self.eval_data).numpy()
        return {"eval/loss": loss / max(count, 1), "eval/accuracy": correct / max(count, 1)}

    def fit(self) -> Result:
        start = time.perf_counter()
        schedule, ckpt = self.schedule, self.checkpointer
        ckpt_every = ckpt.every_steps if ckpt else 0
        if self.coordinator:
            iterator = iter(self.coordinator.create_per_worker_dataset(self.train_data))
        else:
            iterator = iter(self.train_data)
        step = self.step
        window = tf.zeros([3]).numpy()
        window_time = 0.0
        steady_examples, steady_time, first_call = 0.0, 0.0, True
        result = Result(step=step)

        while step < schedule.steps:
            num_steps = schedule.next_stop(step, ckpt_every) - step
            t0 = time.perf_counter()
            totals = self._run_steps(iterator, num_steps)
            elapsed = time.perf_counter() - t0
            step += num_steps
            self.step_counter.assign(step)
            window += totals
            window_time += elapsed
            if not first_call:  # the first call includes tracing
                steady_examples += totals[2]
                steady_time += elapsed
            first_call = False

            record: Metrics = {}
            if step % schedule.log_every == 0 or step == schedule.steps:
                loss, correct, count = window
                record.update({
                    "loss": loss / max(count, 1),
                    "accuracy": correct / max(count, 1),
                    "lr": self._current_lr(),
                    "examples_per_sec": count / max(window_time, 1e-9),
                })
                result.train = dict(record)
                window, window_time = tf.zeros([3]).numpy(), 0.0
            if (schedule.eval_every and step % schedule.eval_every == 0) or step == schedule.steps:
                result.eval = self.evaluate()
                record.update(result.eval)
            if record:
                self._log(step, record)
            if ckpt and (ckpt.due(step)):
                ckpt.save(step)
            if self.preemption:
                self.preemption.check(step)

        result.step = step
        if not result.eval:  # resumed a run that had already finished
            result.eval = self.evaluate()
        if ckpt:
            ckpt.save(step)
        if steady_time > 0:
            result.examples_per_sec = steady_examples / steady_time
        else:
            result.examples_per_sec = result.train.get("examples_per_sec", 0.0)
        result.wall_time_sec = time.perf_counter() - start
        return result

    def _run_steps(self, iterator, num_steps: int):
        """Run `num_steps` steps; the summed [loss, correct, examples]."""
        if self.coordinator is None:
            return self._train_loop(iterator, tf.constant(num_steps)).numpy()
        # Parameter servers: split the steps into one call per worker, which
        # the coordinator schedules on whichever worker is free.
        chunk = max(1, -(-num_steps // self.workers))
        remote = []
        for start in range(0, num_steps, chunk):
            n = min(chunk, num_steps - start)
            remote.append(self.coordinator.schedule(self._train_loop, args=(iterator, tf.constant(n))))
        self.coordinator.join()
        return sum(value.fetch() for value in remote)

    def _current_lr(self) -> float:
        lr = self.optimizer.learning_rate
        return float(lr.numpy() if hasattr(lr, "numpy") else lr)

    def _log(self, step: int, record: Metrics) -> None:
        record = {k: float(v) for k, v in record.items()}
        for logger in self.loggers:
            logger(step, record)


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every

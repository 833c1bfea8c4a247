"""Step runners: run N training steps, or one evaluation, for a task on a strategy.

The step itself (cf. Orbit's StandardTrainer): one `tf.function` runs up to
`steps_per_loop` steps, each a `strategy.run` of the task's train step, and
returns the metrics' state summed over replicas and steps (see metrics.py).
Two runners differ only in who runs that function:

- SyncRunner: every replica runs every step (one device, mirrored, central
  storage, multi-worker, TPU).
- CoordinatorRunner: parameter servers; a ClusterCoordinator schedules calls
  on whichever worker is free, and evaluation runs on the coordinator.

The outer loop (loop.py) decides how many steps to run between its actions.
`make_runner` puts a built run's parts (build.py) together into one.
Knows nothing of Hydra.
"""

import time
from typing import Callable, Dict, Optional

import numpy as np
import tensorflow as tf

from tfdistx.data import input as input_lib
from tfdistx.engine import strategy as strategy_lib
from tfdistx.engine import xla
from tfdistx.engine.build import Run
from tfdistx.engine.data_service import train_service
from tfdistx.engine.metrics import MetricSet
from tfdistx.engine.update import Update
from tfdistx.tasks import Task, traced


class StepRunner:
    def __init__(self, strategy: tf.distribute.Strategy, task: Task, model, update: Update, metrics: MetricSet):
        self.strategy, self.task, self.model, self.update = strategy, task, model, update
        self.metrics = metrics
        # One object, kept: tf.function keys the update's traces by it, and by a weak reference,
        # so a bound method made afresh at each call would never find the step traced before.
        self._state_of = self._metric_state
        self._metric_inputs, self._task_eval_step = traced(task, "metric_inputs"), traced(task, "eval_step")
        # Traced without AutoGraph, as Keras' fit traces its steps: the loops here are
        # TensorFlow's own (tf.while_loop, Dataset.reduce), and converting this code
        # cost every process about 1.3 CPU s before its first step (tasks.traced).
        self._train_loop = tf.function(self._train_loop_fn, autograph=False)

    # -- traced code -----------------------------------------------------------

    def _train_steps(self, batches, first_step):
        return self.update(batches, first_step, self._state_of, self.metrics.zeros())

    def _metric_state(self, labels, outputs, per_example):
        return self.metrics.batch_state(*self._metric_inputs(labels, outputs), per_example)

    def _eval_step(self, batch):
        """(summed state, rows of batch_examples) of one replica's batch."""
        labels, outputs, per_example = self._task_eval_step(self.model, batch)
        labels, predictions = self._metric_inputs(labels, outputs)
        return self.metrics.batch_state(labels, predictions, per_example), self.metrics.batch_examples(
            labels, predictions
        )

    def _examples_array(self):
        """Every eval batch's rows (batch_examples, and a last column of 1
        for a real example, 0 for padding), added in order."""
        return tf.TensorArray(
            tf.float32,
            size=0,
            dynamic_size=True,
            infer_shape=False,
            element_shape=tf.TensorShape([None, self.metrics.example_width + 1]),
        )

    @staticmethod
    def _real(rows: tf.Tensor) -> tf.Tensor:
        return tf.concat([rows, tf.ones([tf.shape(rows)[0], 1], rows.dtype)], axis=1)

    def _train_loop_fn(self, iterator, first_step, num_steps):
        """Steps first_step .. first_step + num_steps - 1; their summed state.
        The update takes `steps_per_call` steps at a time (several batches
        in one XLA computation: update.py); the steps left over, one at a time.

        Each replica adds its own steps' states up, and they are summed over
        replicas once, at the end: a sum over replicas inside the loop would
        be a second collective in every step of a multi-worker run, beside
        the gradients' (benchmarks/bench_multiworker_step.py measures it)."""
        per_call = self.update.steps_per_call
        local = self.strategy.experimental_local_results(self.strategy.run(self.metrics.zeros))
        local = _repeat(
            num_steps // per_call,
            lambda i, local: self._steps(iterator, first_step + tf.cast(i * per_call, tf.int64), per_call, local),
            local,
        )
        if per_call > 1:
            done = num_steps // per_call * per_call
            local = _repeat(
                num_steps - done,
                lambda i, local: self._steps(iterator, first_step + tf.cast(done + i, tf.int64), 1, local),
                local,
            )
        return self._sum_over_replicas(local)

    def _steps(self, iterator, first_step, count: int, local: tuple) -> tuple:
        """`local` (this process's replicas' states) plus theirs of `count` more steps."""
        batches = tuple(next(iterator) for _ in range(count))
        per_replica = self.strategy.run(self._train_steps, args=(batches, first_step))
        return tuple(
            total + tf.cast(state, tf.float64)
            for total, state in zip(local, self.strategy.experimental_local_results(per_replica))
        )

    def _sum_over_replicas(self, local: tuple) -> tf.Tensor:
        if self.strategy.num_replicas_in_sync == len(local):  # every replica is in this process: no collective
            return tf.add_n(list(local))
        # Replica r of a worker is its (r mod local)-th local one (a worker's replicas are numbered together).
        count = len(local)
        given = self.strategy.experimental_distribute_values_from_function(
            lambda ctx: local[ctx.replica_id_in_sync_group % count]
        )
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, given, axis=None)

    def xla_failure(self, batch_spec) -> Optional[str]:
        """Why XLA cannot compile this runner's step (None: it can, or nothing
        is compiled) for a replica's batch of `batch_spec`: update.py's
        answer, asked where the step runs (a replica's context: the whole
        step sums over replicas)."""
        found = []
        state_spec = tf.TensorSpec.from_tensor(self.metrics.zeros())
        check = lambda: found.append(self.update.xla_failure(batch_spec, self._state_of, state_spec))  # noqa: E731
        if self.update.whole_step:
            self.strategy.run(check)
        else:  # the gradients alone: no sum over replicas in them, and asked once, not by each replica
            check()
        return found[0]

    # -- what the loop calls ---------------------------------------------------

    def train(self, first_step: int, num_steps: int) -> np.ndarray:
        raise NotImplementedError

    def evaluate(self) -> Dict[str, float]:
        """Loss and metrics over the whole eval data (or `trainer.eval_steps` batches), prefixed `eval/`."""
        if self.eval_data is None:
            return {}
        totals, rows = self._evaluate(self.eval_data)
        if not self.metrics.ranked:
            return self.results(totals.numpy(), prefix="eval/")
        rows = self._rows_of_every_worker(rows).numpy()  # a last column of 1 for a real example, 0 for padding (_real)
        return self.results(totals.numpy(), prefix="eval/", rows=rows[rows[:, -1] > 0, :-1])

    def _rows_of_every_worker(self, rows: tf.Tensor) -> tf.Tensor:
        return rows  # evaluated in one process

    def results(self, totals: np.ndarray, prefix: str = "", rows: Optional[np.ndarray] = None) -> Dict[str, float]:
        return self.metrics.results(totals, prefix, rows)

    def examples(self, totals: np.ndarray) -> float:
        return self.metrics.examples(totals)


class SyncRunner(StepRunner):
    def __init__(self, *args, train_data, eval_data=None, **kwargs):
        """`train_data`, `eval_data`: distributed datasets (input.py)."""
        super().__init__(*args, **kwargs)
        self.iterator = iter(train_data) if train_data is not None else None
        self.eval_data = eval_data
        self._evaluate = tf.function(self._evaluate_fn, autograph=False)

    def _evaluate_fn(self, dataset):
        @tf.autograph.experimental.do_not_convert  # a plain tf.data.Dataset would have it converted
        def add(summed, batch):
            totals, examples, i = summed
            state, rows = self.strategy.run(self._eval_step, args=(batch,))
            totals += tf.cast(self.strategy.reduce(tf.distribute.ReduceOp.SUM, state, axis=None), tf.float64)
            if self.metrics.ranked:  # this worker's replicas' rows; other workers' are gathered once, at the end
                examples = examples.write(
                    i, self._real(tf.concat(self.strategy.experimental_local_results(rows), axis=0))
                )
                i += 1
            return totals, examples, i

        totals, examples, _ = dataset.reduce((self.metrics.zeros(), self._examples_array(), tf.constant(0)), add)
        return totals, examples.concat()

    def _rows_of_every_worker(self, rows: tf.Tensor) -> tf.Tensor:
        """One all-gather of each worker's rows after the evaluation, not
        one per batch: a gather inside the loop over a distributed dataset
        fails on its uneven last batches (measured: shape mismatch in the
        collective). Each worker's first replica gives its rows, the
        others none; all are padded to the longest (the gather needs one
        shape), and the padding is marked 0 in the last column."""
        # Of the synchronous strategies tfdistx runs, only multi-worker has replicas in other processes.
        if not isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return rows
        local = len(self.strategy.extended.worker_devices)
        if self.strategy.num_replicas_in_sync == local:  # a cluster of one
            return rows
        given = self.strategy.experimental_distribute_values_from_function(
            lambda ctx: rows if ctx.replica_id_in_sync_group % local == 0 else rows[:0]
        )
        return self.strategy.experimental_local_results(self._gather_rows(given))[0]

    @tf.function(reduce_retracing=True, autograph=False)
    def _gather_rows(self, given):
        def padded_gather(rows):
            context = tf.distribute.get_replica_context()
            size = tf.shape(rows)[0]
            longest = tf.reduce_max(context.all_gather(tf.reshape(size, [1]), axis=0))
            return context.all_gather(tf.pad(rows, [[0, longest - size], [0, 0]]), axis=0)

        return self.strategy.run(padded_gather, args=(given,))

    def train(self, first_step: int, num_steps: int) -> np.ndarray:
        return self._train_loop(self.iterator, tf.constant(first_step, tf.int64), tf.constant(num_steps)).numpy()


class CoordinatorRunner(StepRunner):
    def __init__(self, *args, coordinator, workers: int, train_data, eval_data=None, **kwargs):
        """`train_data`: a distributed dataset made per worker; `eval_data`: a
        plain dataset, evaluated here on the coordinator (reading the
        variables from the ps tasks)."""
        super().__init__(*args, **kwargs)
        self.coordinator, self.workers = coordinator, workers
        self.progressed = (
            time.monotonic()
        )  # when the last loop's steps were all done (engine/preemption.watching_servers)
        self.iterator = iter(coordinator.create_per_worker_dataset(train_data)) if train_data is not None else None
        self.eval_data = eval_data
        self._evaluate = tf.function(self._evaluate_fn, autograph=False)

    def _evaluate_fn(self, dataset):
        @tf.autograph.experimental.do_not_convert  # tf.data would have it converted
        def add(summed, batch):
            totals, examples, i = summed
            state, rows = self._eval_step(batch)
            return totals + tf.cast(state, tf.float64), examples.write(i, self._real(rows)), i + 1

        totals, examples, _ = dataset.reduce((self.metrics.zeros(), self._examples_array(), tf.constant(0)), add)
        return totals, examples.concat()

    def train(self, first_step: int, num_steps: int) -> np.ndarray:
        # One call per worker, each a contiguous range of the true steps (so
        # learning-rate schedules see the step they belong to); the
        # coordinator runs each on whichever worker is free.
        chunk = max(1, -(-num_steps // self.workers))
        remote = []
        for offset in range(0, num_steps, chunk):
            n = min(chunk, num_steps - offset)
            args = (self.iterator, tf.constant(first_step + offset, tf.int64), tf.constant(n))
            remote.append(self.coordinator.schedule(self._train_loop, args=args))
        self.coordinator.join()
        self.progressed = time.monotonic()
        return sum(value.fetch() for value in remote)


def _repeat(times: tf.Tensor, body: Callable, state):
    """`state = body(i, state)` for i in 0 .. times - 1, as a tf.while_loop
    (what AutoGraph makes of `for i in tf.range(times)`)."""
    _, state = tf.while_loop(lambda i, _: i < times, lambda i, state: (i + 1, body(i, state)), (tf.constant(0), state))
    return state


def make_runner(run: Run, skip_steps: int = 0, train: bool = True):
    """The step runner for the run's strategy, with its datasets and metrics."""
    spec, pipeline = run.spec, run.spec.pipeline
    metrics = MetricSet(run.task.metrics())
    metrics.build(*run.task.metric_inputs(*run.sample))
    train_data = (
        input_lib.train_dataset(
            run.strategy,
            run.source,
            run.global_batch,
            seed=spec.trainer.seed,
            shuffle_buffer=pipeline.shuffle_buffer,
            cache=pipeline.cache,
            skip_steps=skip_steps,
            ps_workers=run.workers if run.row.asynchronous else 0,
            service=train_service(pipeline.service, run.placement, skip_steps),
        )
        if train
        else None
    )
    eval_steps = spec.trainer.eval_steps
    update = Update(
        run.task,
        run.model,
        run.optimizer,
        run.global_batch,
        spec.trainer.accumulate_steps,
        jit_compile=run.jit_compile,
        all_reduce_options=strategy_lib.all_reduce_options(run.strategy_name, spec.strategy.options),
        whole_step=run.row.xla_whole_step,
        all_reduce_dtype=strategy_lib.all_reduce_dtype(run.strategy_name, spec.strategy.options),
        variables=run.train_variables,
        learning_rate=run.learning_rate,
        steps_per_xla_call=run.steps_per_xla_call,
        gradient_sum=run.gradient_sum,
    )
    parts = (run.strategy, run.task, run.model, update, metrics)
    eval_batch = pipeline.batch_size  # not the accumulated batch: what fits in memory
    if run.coordinator is None:
        eval_data = input_lib.eval_dataset(
            run.strategy, run.source.eval, eval_batch, steps=eval_steps, cache=pipeline.cache
        )
        runner = SyncRunner(*parts, train_data=train_data, eval_data=eval_data)
        if train:
            xla.compile_or_fall_back(
                run, runner
            )  # before the first step: a step XLA cannot compile never starts compiled
        return runner
    # evaluated inline on the coordinator, reading the variables from the ps tasks
    eval_data = input_lib.local_eval_dataset(run.source.eval, eval_batch, steps=eval_steps, cache=pipeline.cache)
    return CoordinatorRunner(
        *parts, coordinator=run.coordinator, workers=run.workers, train_data=train_data, eval_data=eval_data
    )

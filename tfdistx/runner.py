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
Knows nothing of Hydra.
"""

from typing import Dict, Optional

import numpy as np
import tensorflow as tf

from tfdistx.metrics import MetricSet
from tfdistx.optim import LearningRateAtStep
from tfdistx.tasks import Task
from tfdistx.update import Update


class StepRunner:
    def __init__(self, strategy: tf.distribute.Strategy, task: Task, model, update: Update, metrics: MetricSet,
                 learning_rate: Optional[LearningRateAtStep] = None):
        self.strategy, self.task, self.model, self.update = strategy, task, model, update
        self.metrics, self.learning_rate = metrics, learning_rate
        self._train_loop = tf.function(self._train_loop_fn)

    # -- traced code -----------------------------------------------------------

    def _train_step(self, batch, step):
        if self.learning_rate is not None:
            # The schedule follows the loop's own step, not optimizer.iterations,
            # which concurrent parameter-server workers undercount.
            self.learning_rate.step = step
        return self.update(batch, self._metric_state)

    def _metric_state(self, labels, outputs, per_example):
        return self.metrics.batch_state(*self.task.metric_inputs(labels, outputs), per_example)

    def _eval_step(self, batch):
        return self._metric_state(*self.task.eval_step(self.model, batch))

    def _train_loop_fn(self, iterator, first_step, num_steps):
        """Steps first_step .. first_step + num_steps - 1; their summed state."""
        totals = self.metrics.zeros()
        for i in tf.range(num_steps):
            step = first_step + tf.cast(i, tf.int64)
            per_replica = self.strategy.run(self._train_step, args=(next(iterator), step))
            totals += tf.cast(self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None), tf.float64)
        return totals

    # -- what the loop calls ---------------------------------------------------

    def train(self, first_step: int, num_steps: int) -> np.ndarray:
        raise NotImplementedError

    def evaluate(self) -> Dict[str, float]:
        """Loss and metrics over the whole eval data (or `trainer.eval_steps` batches), prefixed `eval/`."""
        if self.eval_data is None:
            return {}
        return self.results(self._evaluate(self.eval_data).numpy(), prefix="eval/")

    def results(self, totals: np.ndarray, prefix: str = "") -> Dict[str, float]:
        return self.metrics.results(totals, prefix)

    def examples(self, totals: np.ndarray) -> float:
        return self.metrics.examples(totals)


class SyncRunner(StepRunner):
    def __init__(self, *args, train_data, eval_data=None, **kwargs):
        """`train_data`, `eval_data`: distributed datasets (input.py)."""
        super().__init__(*args, **kwargs)
        self.iterator = iter(train_data) if train_data is not None else None
        self.eval_data = eval_data
        self._evaluate = tf.function(self._evaluate_fn)

    def _evaluate_fn(self, dataset):
        totals = self.metrics.zeros()
        for batch in dataset:
            per_replica = self.strategy.run(self._eval_step, args=(batch,))
            totals += tf.cast(self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None), tf.float64)
        return totals

    def train(self, first_step: int, num_steps: int) -> np.ndarray:
        return self._train_loop(self.iterator, tf.constant(first_step, tf.int64), tf.constant(num_steps)).numpy()


class CoordinatorRunner(StepRunner):
    def __init__(self, *args, coordinator, workers: int, train_data, eval_data=None, **kwargs):
        """`train_data`: a distributed dataset made per worker; `eval_data`: a
        plain dataset, evaluated here on the coordinator (reading the
        variables from the ps tasks)."""
        super().__init__(*args, **kwargs)
        self.coordinator, self.workers = coordinator, workers
        self.iterator = iter(coordinator.create_per_worker_dataset(train_data)) if train_data is not None else None
        self.eval_data = eval_data
        self._evaluate = tf.function(self._evaluate_fn)

    def _evaluate_fn(self, dataset):
        totals = self.metrics.zeros()
        for batch in dataset:
            totals += tf.cast(self._eval_step(batch), tf.float64)
        return totals

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
        return sum(value.fetch() for value in remote)

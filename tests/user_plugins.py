"""A user's own model and data functions, plugged in with `_target_`."""

import os
import signal
import time

import keras
import numpy as np
import tensorflow as tf

from tfdistx.data import DataSource, shard


def tiny_model(input_shape, num_classes):
    return keras.Sequential(
        [keras.Input(shape=tuple(input_shape)), keras.layers.Flatten(), keras.layers.Dense(num_classes)]
    )


def tiny_cnn(input_shape, num_classes, filters=8):
    return keras.Sequential(
        [
            keras.Input(shape=tuple(input_shape)),
            keras.layers.Conv2D(filters, 3),
            keras.layers.Flatten(),
            keras.layers.Dense(num_classes),
        ]
    )


def ten_logits(input_shape):
    """A model that ignores the width the task asks for."""
    return keras.Sequential([keras.Input(shape=tuple(input_shape)), keras.layers.Flatten(), keras.layers.Dense(10)])


def constant_data(features: int = 8, num_classes: int = 2, examples: int = 256):
    """Label = whether the first feature is positive: trivially learnable."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((examples, features)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return DataSource(
        train=lambda ctx: shard(tf.data.Dataset.from_tensor_slices((x, y)), ctx),
        eval=lambda ctx: shard(tf.data.Dataset.from_tensor_slices((x, y)), ctx),
        input_shape=(features,),
        num_classes=num_classes,
        train_examples=examples,
    )


def broken_on_worker_1(**kwargs):
    """Data that cannot be built on worker 1 of a cluster: the launcher must stop the others."""
    import json
    import os

    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    if task.get("index") == 1:
        raise RuntimeError("worker 1 cannot read its data")
    from tfdistx.data import synthetic

    return synthetic(**kwargs)


def crashing_on_worker_1(**kwargs):
    """Worker 1 of a cluster dies hard (exit code 7) every time it starts."""
    import json
    import os

    if json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index") == 1:
        os._exit(7)
    from tfdistx.data import synthetic

    return synthetic(**kwargs)


# -- a probe of which examples were trained on (the data split across workers) --


def indexed_data(examples: int = 512, features: int = 4):
    """Each example carries its own index as a feature."""
    rng = np.random.default_rng(0)
    x = {
        "x": rng.standard_normal((examples, features)).astype(np.float32),
        "index": np.arange(examples, dtype=np.int64),
    }
    y = (x["x"][:, 0] > 0).astype(np.int64)
    return DataSource(
        train=lambda ctx: shard(tf.data.Dataset.from_tensor_slices((x, y)), ctx),
        eval=lambda ctx: shard(tf.data.Dataset.from_tensor_slices((x, y)), ctx),
        num_classes=2,
        train_examples=examples,
    )


class CountExamples(keras.layers.Layer):
    """Counts, in a weight called `seen`, how often each example index is
    trained on: summed over replicas, workers and steps."""

    def __init__(self, examples, **kwargs):
        super().__init__(**kwargs)
        self.examples = examples

    def build(self, input_shape):
        self.seen = self.add_weight(
            shape=(self.examples,), initializer="zeros", trainable=False, aggregation="sum", name="seen"
        )

    def call(self, index, training=False):
        if training:
            counts = tf.math.bincount(
                tf.cast(tf.reshape(index, [-1]), tf.int32),
                minlength=self.examples,
                maxlength=self.examples,
                dtype=tf.float32,
            )
            # The TF variable's own assign_add: one atomic op, also on a parameter server.
            self.seen.value.assign_add(counts)
        return tf.zeros_like(tf.cast(index, tf.float32))


def counting_model(feature_spec, num_outputs, examples: int = 512):
    inputs = {
        name: keras.Input(shape=tuple(spec.shape), dtype=spec.dtype.name, name=name)
        for name, spec in feature_spec.items()
    }
    logits = keras.layers.Dense(num_outputs)(inputs["x"])
    marker = CountExamples(examples, name="count_examples")(inputs["index"])
    return keras.Model(inputs, keras.layers.Add()([logits, keras.layers.Reshape((1,))(marker)]))


# -- a probe of the learning rate each step used --


def far_targets(examples: int = 256):
    """Targets so large that an MAE gradient on the prediction is always -1."""
    x = np.zeros((examples, 2), np.float32)
    y = np.full((examples,), 1e6, np.float32)
    return DataSource(
        train=lambda ctx: shard(tf.data.Dataset.from_tensor_slices((x, y)), ctx),
        eval=lambda ctx: shard(tf.data.Dataset.from_tensor_slices((x[:16], y[:16])), ctx),
        train_examples=examples,
    )


class Bias(keras.layers.Layer):
    def build(self, input_shape):
        self.bias = self.add_weight(shape=(1,), initializer="zeros", name="bias")

    def call(self, x):
        return tf.zeros_like(x[:, :1]) + self.bias


def bias_only(input_shape, num_outputs):
    """Predicts one learned number, whatever the input."""
    inputs = keras.Input(shape=tuple(input_shape))
    return keras.Model(inputs, Bias()(inputs))


# -- a task of a user's own: the contract in tfdistx/tasks/__init__.py --

from tfdistx.tasks import Task, column  # noqa: E402


class SquaredHinge(Task):
    """A yes/no task with a max-margin loss on one output, and a metric of its own."""

    name = "squared_hinge"

    def num_outputs(self, label_spec, num_classes):
        return 1

    def loss(self, labels, outputs):
        return keras.losses.squared_hinge(2.0 * column(labels) - 1.0, outputs)  # labels 0/1 -> -1/+1

    def metrics(self):
        return {"margin_accuracy": keras.metrics.BinaryAccuracy(threshold=0.0)}

    def metric_inputs(self, labels, outputs):
        return column(labels), outputs

    def serving_outputs(self, outputs):
        return {"score": outputs, "label": tf.cast(outputs > 0, tf.int64)}


class GuardedSquaredHinge(SquaredHinge):
    """SquaredHinge with Python control flow on tensors, as a user writes it
    and AutoGraph converts it: an `if` on a tensor (never true here) and a
    `for` over a tensor's range. It trains exactly as SquaredHinge does."""

    def loss(self, labels, outputs):
        per_example = super().loss(labels, outputs)
        if tf.reduce_any(tf.math.is_nan(per_example)):
            per_example = tf.zeros_like(per_example)
        total = tf.zeros_like(per_example)
        for _ in tf.range(2):
            total += per_example / 2.0
        return total


def two_classes_by_default(num_classes=2, **kwargs):
    """A user's data function with its own default: refuses any other class count."""
    if num_classes != 2:
        raise ValueError(f"got num_classes={num_classes}: a default group's key reached a user target")
    from tfdistx.data import synthetic

    return synthetic(num_classes=num_classes, image_shape=[4, 4, 1], train_examples=256, eval_examples=64, seed=0)


# -- a probe for resuming on another topology (test_topology_resume.py) --


def indexed_clicks(examples: int = 256, eval_examples: int = 64, vocab_size: int = 1000):
    """synthetic_categorical's rows, in memory (order.ArrayExamples: one example
    order on every topology), each carrying its own index as a feature."""
    from tfdistx.data import in_memory, synthetic_categorical

    source = synthetic_categorical(vocab_size=vocab_size, train_examples=examples, eval_examples=eval_examples)

    def indexed(arrays):
        features, labels = arrays
        return {**features, "index": np.arange(len(labels), dtype=np.int64)}, labels

    return in_memory(indexed(source.train.arrays), indexed(source.eval.arrays), train_examples=examples)


def counting_wide_deep(feature_spec, num_outputs, examples: int = 256, vocab_size: int = 1000, shards: int = 1):
    """tfdistx's wide_deep (its tables in `shards` row shards) beside a
    CountExamples probe of which examples each step trained on."""
    from tfdistx.models import wide_deep

    inner_spec = {name: spec for name, spec in feature_spec.items() if name != "index"}
    inner = wide_deep(inner_spec, num_outputs, vocab_size=vocab_size, embedding_dim=4, hidden_units=(8,), shards=shards)
    inputs = {
        name: keras.Input(shape=tuple(spec.shape), dtype=spec.dtype.name, name=name)
        for name, spec in feature_spec.items()
    }
    logits = inner({name: inputs[name] for name in inner_spec})
    marker = CountExamples(examples, name="count_examples")(inputs["index"])
    return keras.Model(inputs, keras.layers.Add()([logits, keras.layers.Reshape((num_outputs,))(marker)]))


# -- pipelines that break the DataSource contract, or leave out the eval split --


def batched_data(features: int = 8, examples: int = 256):
    """A pipeline function that batches itself (the contract says: single examples)."""
    x = np.zeros((examples, features), np.float32)
    y = np.zeros((examples,), np.int64)
    return DataSource(train=lambda ctx: tf.data.Dataset.from_tensor_slices((x, y)).batch(32), eval=None, num_classes=2)


def train_only_data(features: int = 8, examples: int = 256):
    """Training examples and no eval split (eval=None)."""
    x = np.random.default_rng(0).standard_normal((examples, features)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return DataSource(
        train=lambda ctx: shard(tf.data.Dataset.from_tensor_slices((x, y)), ctx),
        eval=None,
        num_classes=2,
        train_examples=examples,
    )


# -- what trainer.jit_compile=auto must look into (issue 32): a model's own weight, its ops, a loss XLA cannot
# compile --


class HistogramModel(keras.Model):
    """A user's own model: Dense sublayers, a weight it holds itself (a
    learned scale on the logits) and a `bincount` in its call, whose output
    size XLA cannot know when it compiles."""

    def __init__(self, num_outputs, hidden=16, **kwargs):
        super().__init__(**kwargs)
        self.flatten = keras.layers.Flatten()
        self.hidden = keras.layers.Dense(hidden, activation="relu")
        self.logits = keras.layers.Dense(num_outputs)
        self.scale = self.add_weight(shape=(), initializer="ones", name="scale")

    def call(self, x, training=False):
        h = self.hidden(self.flatten(x))
        # How many examples of the batch fired as many units as this one, as a share of the batch.
        active = tf.reduce_sum(tf.cast(h > 0, tf.int32), axis=1)
        share = tf.gather(tf.math.bincount(active, dtype=tf.float32), active) / tf.cast(tf.shape(h)[0], tf.float32)
        return self.logits(h) * self.scale + 0.01 * share[:, None]


def histogram_model(input_shape, num_outputs):
    model = HistogramModel(num_outputs)
    model(np.zeros((1, *input_shape), np.float32))  # its weights made before the optimizer is built for them
    return model


from tfdistx.tasks.classification import Classification  # noqa: E402


class BalancedClassification(Classification):
    """Classification whose loss weighs each example by the inverse of its
    class's count in the batch (a bincount of the labels, as long as the
    largest label present: a size XLA cannot know when it compiles)."""

    name = "balanced_classification"

    def loss(self, labels, outputs):
        ids = self._ids(labels)
        counts = tf.math.bincount(tf.cast(ids, tf.int32), dtype=tf.float32)
        weights = tf.cast(tf.size(ids), tf.float32) / (
            tf.gather(counts, ids) * tf.cast(tf.math.count_nonzero(counts), tf.float32)
        )
        return super().loss(labels, outputs) * weights


class StopBelow(keras.callbacks.Callback):
    """A user's Keras callback: notes each record's loss, and stops the run
    at the first record whose loss is below `loss`."""

    def __init__(self, loss: float):
        super().__init__()
        self.loss, self.seen = loss, []

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append((epoch, logs["loss"]))
        if logs["loss"] < self.loss:
            self.model.stop_training = True


class StopAtStep:
    """A tfdistx action: asks the loop to stop at `step`, and says so."""

    def __init__(self, step: int):
        self.step, self.stop_requested = step, None

    def next_stop(self, step):
        return self.step if step < self.step else None

    def __call__(self, step, record):
        if step >= self.step:
            self.stop_requested = f"step {step} reached"


class Pace(keras.callbacks.Callback):
    """Holds each log record for `seconds`: a short run slow enough for a
    test to change its cluster while it trains (its steps, not the test's
    waits: the test waits on what the run writes)."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def on_epoch_end(self, epoch, logs=None):
        time.sleep(self.seconds)


class Raises(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if logs["step"] >= 20:
            raise ValueError("the chat server said no")


def note_loss(epoch, logs, path):
    """For keras.callbacks.LambdaCallback(on_epoch_end=...), given with _partial_: a line per record in `path`."""
    with open(path, "a") as file:
        file.write(f"{epoch} {logs['loss']}\n")


class LinesLogger:
    """A user's logger: a line per record in <run dir>/NAME."""

    def __init__(self, run_dir, name="mine.txt"):
        self.file = open(f"{run_dir}/{name}", "a")

    def __call__(self, step, metrics):
        self.file.write(f"{step} {metrics['loss']}\n")

    def close(self):
        self.file.close()


class RaisingLogger:
    """A user's logger that raises ValueError("logger boom"): at the first
    record from step `at` on, or (`at` None) when it is closed."""

    def __init__(self, at=None):
        self.at = at

    def __call__(self, step, metrics):
        if self.at is not None and step >= self.at:
            raise ValueError("logger boom")

    def close(self):
        if self.at is None:
            raise ValueError("logger boom")


# -- the three ways Keras writes a model (issue 42): each trains, resumes and exports as a functional one does --


class Subclassed(keras.Model):
    """A subclassed model as Keras' guide writes one: sublayers made in
    `__init__`, used in `call`, and a weight of its own made lazily in
    `build()` (a learned scale per output), so no weight exists until the
    model is first called."""

    def __init__(self, num_outputs, hidden=32, **kwargs):
        super().__init__(**kwargs)
        self.flatten = keras.layers.Flatten()
        self.hidden = keras.layers.Dense(hidden, activation="relu")
        self.logits = keras.layers.Dense(num_outputs)
        self.num_outputs = num_outputs

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(self.num_outputs,), initializer="ones", name="scale")

    def call(self, x):
        return self.logits(self.hidden(self.flatten(x))) * self.scale


def subclassed(num_outputs):
    return Subclassed(num_outputs)


class NormalizedWithDropout(keras.Model):
    """BatchNormalization and Dropout in a subclassed model that passes
    `training` to them: the batch norm's moving statistics are variables
    each replica updates from its own batch (issue 60)."""

    def __init__(self, num_outputs, hidden=32, **kwargs):
        super().__init__(**kwargs)
        self.flatten = keras.layers.Flatten()
        self.hidden = keras.layers.Dense(hidden)
        self.norm = keras.layers.BatchNormalization()
        self.drop = keras.layers.Dropout(0.3)
        self.logits = keras.layers.Dense(num_outputs)

    def call(self, x, training=None):
        h = keras.activations.relu(self.norm(self.hidden(self.flatten(x)), training=training))
        return self.logits(self.drop(h, training=training))


def normalized_with_dropout(num_outputs):
    return NormalizedWithDropout(num_outputs)


def sequential_without_input(num_outputs):
    """`keras.Sequential` without a `keras.Input`: its weights are made at its first call."""
    return keras.Sequential(
        [keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(num_outputs)]
    )


class Recorder(keras.callbacks.Callback):
    """Notes every hook Keras calls, its numbers and its logs' keys, a JSON
    line each in `path`: the same callback is run under Keras' fit and under
    tfdistx, and the two records compared (test_unit_keras_callbacks.py)."""

    HOOKS = (
        "on_train_begin",
        "on_train_end",
        "on_epoch_begin",
        "on_epoch_end",
        "on_train_batch_begin",
        "on_train_batch_end",
        "on_test_begin",
        "on_test_end",
        "on_test_batch_begin",
        "on_test_batch_end",
    )

    def __init__(self, path):
        super().__init__()
        self.path = path
        for hook in self.HOOKS:
            setattr(self, hook, self._noting(hook))

    def set_params(self, params):
        super().set_params(params)
        self._note(["set_params", {k: params.get(k) for k in ("epochs", "steps")}])

    def _noting(self, hook):
        def note(*args, **kwargs):
            numbers = [a for a in args if isinstance(a, int)]
            logs = kwargs.get("logs", next((a for a in args if isinstance(a, dict)), None))
            self._note([hook, *numbers, sorted(logs) if logs is not None else None])

        return note

    def _note(self, line):
        import json

        with open(self.path, "a") as file:
            file.write(json.dumps(line) + "\n")


class FailsIn(keras.callbacks.Callback):
    """Raises RuntimeError in `hook` once `step` steps are done (the steps
    it knows of: the `step` of its last on_train_batch_end's logs); with
    `interrupted`, what Ctrl-C becomes inside a C call that calls back into
    Python: CPython's SystemError, the KeyboardInterrupt its cause."""

    def __init__(self, hook: str, step: int, interrupted: bool = False):
        super().__init__()
        self.done, self.step, self.interrupted = 0, step, interrupted
        setattr(self, hook, self._failing(getattr(self, hook)))

    def on_train_batch_end(self, batch, logs=None):
        self.done = logs["step"]

    def _failing(self, hook):
        def failing(*args):
            hook(*args)
            if self.done >= self.step and self.interrupted:
                raise SystemError(
                    "<built-in method __array__> returned a result with an exception set"
                ) from KeyboardInterrupt()
            if self.done >= self.step:
                raise RuntimeError("boom")

        return failing


class MyBackup(keras.callbacks.BackupAndRestore):
    """A user's subclass of a callback tfdistx refuses by name."""


class SaveInto(keras.callbacks.ModelCheckpoint):
    """A user's subclass of ModelCheckpoint that picks its own file: `into`, a directory, then `name` in it."""

    def __init__(self, into, name="model.keras"):
        super().__init__(filepath=f"{into}/{name}")


def note_step(step, record, path):
    """A tfdistx action as a plain function: a line per record in `path`."""
    if record:
        with open(path, "a") as file:
            file.write(f"{step}\n")


# -- learning-rate schedules whose rate stops being a number (test_unit_optimizers.py) --


class NaNAfter(keras.optimizers.schedules.LearningRateSchedule):
    """0.001 until step `after`, then NaN: one TensorFlow computation over any steps."""

    def __init__(self, after: int = 5):
        self.after = after

    def __call__(self, step):
        return tf.where(tf.cast(step, tf.int64) >= self.after, float("nan"), 0.001)


class NaNAfterOneByOne(NaNAfter):
    """The same rates, from Python: it cannot take a vector of steps."""

    def __call__(self, step):
        return float("nan") if int(step) >= self.after else 0.001


# -- weights that stop being numbers while the loss stays one (issue 60) --


def ids_data(examples: int = 256, looked_up: int = 10, num_classes: int = 2):
    """Each example one id below `looked_up` (an embedding's rows beyond it are never read); its label the
    id's parity."""
    ids = np.random.default_rng(0).integers(0, looked_up, (examples, 1)).astype(np.int64)
    labels = (ids[:, 0] % num_classes).astype(np.int64)
    return DataSource(
        train=lambda ctx: shard(tf.data.Dataset.from_tensor_slices((ids, labels)), ctx),
        eval=lambda ctx: shard(tf.data.Dataset.from_tensor_slices((ids, labels)), ctx),
        num_classes=num_classes,
        train_examples=examples,
    )


def embedded_ids(feature_spec, num_outputs, vocabulary: int = 20):
    """An embedding table of `vocabulary` rows read by id, then a Dense layer."""
    inputs = keras.Input(shape=tuple(feature_spec.shape), dtype=feature_spec.dtype.name)
    rows = keras.layers.Embedding(vocabulary, 4, name="table")(inputs)
    return keras.Model(inputs, keras.layers.Dense(num_outputs)(keras.layers.Flatten()(rows)))


class AdamWithoutEpsilon(keras.optimizers.Adam):
    """Adam, its epsilon 0 when `zero_epsilon`: an entry whose gradient has
    been zero since the start (a table's row no batch reads) is updated by
    0 / 0, NaN, as Keras' Adafactor divides where gradients stayed zero; the
    loss, which never reads that row, stays a number."""

    def __init__(self, zero_epsilon: bool = False, **kwargs):
        super().__init__(**kwargs)
        if zero_epsilon:
            self.epsilon = 0.0


class _Slow(keras.layers.Layer):
    """Sleeps `seconds` in each call, inside the step (a tf.numpy_function: TensorFlow runs it in the
    graph, as a user's slow model's time is spent), and passes its input on unchanged."""

    def __init__(self, seconds: float, **kwargs):
        super().__init__(**kwargs)
        self.seconds = seconds

    def call(self, inputs):
        def pause(x):
            time.sleep(self.seconds)
            return x

        slept = tf.numpy_function(pause, [inputs], inputs.dtype, stateful=True)
        return tf.ensure_shape(slept, inputs.shape)


def slow_model(input_shape, num_classes, seconds: float = 0.1):
    """A model whose every step takes about `seconds` (a slow model's step, as a user's large one)."""
    return keras.Sequential(
        [
            keras.Input(shape=tuple(input_shape)),
            keras.layers.Flatten(),
            _Slow(seconds),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(num_classes),
        ]
    )


class InterruptsAt(keras.callbacks.Callback):
    """Ctrl-C, `times` over, at the record of step `step` (a loop boundary): SIGINT to this process, as a
    terminal sends it (each handled before the next is sent: two are a second Ctrl-C, not one)."""

    def __init__(self, step: int, times: int = 1, hold: float = 0):
        super().__init__()
        self.step, self.times, self.hold = step, times, hold  # hold: then keeps the boundary that long (a slow one)

    def on_epoch_end(self, epoch, logs=None):
        if logs["step"] == self.step:
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGINT)
            time.sleep(self.hold)


class DumpState(keras.callbacks.Callback):
    """At each record whose step is a multiple of `every`: the trained
    weights and the optimizer's variables as they are then, into
    `<path>/step-N.npz` (what the checkpoint of that step must hold, however
    long its write takes while the steps go on); before the first step,
    `<path>/begin.npz` (a resumed run's: what it restored)."""

    def __init__(self, path: str, every: int):
        super().__init__()
        self.path, self.every = path, every

    def on_train_begin(self, logs=None):  # a resumed run's: what it restored
        self._dump("begin")

    def on_epoch_end(self, epoch, logs=None):
        step = int(logs["step"])
        if step % self.every == 0:
            self._dump(f"step-{step}")

    def _dump(self, name: str) -> None:
        values = [v.numpy() for v in [*self.model.trainable_weights, *self.model.optimizer.variables]]
        np.savez(f"{self.path}/{name}.npz", *values)


class SignalAt:
    """A tfdistx action: at `step` (a loop boundary it makes), SIGTERM to its
    own process, as a scheduler's preemption would send it then."""

    def __init__(self, step: int):
        self.step = step

    def next_stop(self, step):
        return self.step if step < self.step else None

    def __call__(self, step, record):
        if step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)

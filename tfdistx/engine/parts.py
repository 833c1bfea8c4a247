"""The parts of a run, each made from its spec: the task, the data source,
the model (fresh, or rebuilt from a checkpoint), the optimizer as the
checkpoint holds it, and what re-splits a model's tables. The build phase
(build.py) puts them together for training; a warm start, the export and
the commands that read a run's data (predict, data write) make the one
part they need from here, without the phase.

Bad input met while making them (a model that does not take the data, an
optimizer's bad option) is refused as a ConfigError naming the key.
"""

from pathlib import Path
from typing import Optional

import keras
import tensorflow as tf

from tfdistx.core.errors import ConfigError, first_line
from tfdistx.core.run_spec import Optimizer, RunSpec
from tfdistx.core.targets import Target
from tfdistx.data.sources import DataSource, single_examples
from tfdistx.engine import process_wide, resplit, sharding
from tfdistx.engine.optim import LearningRateAtStep, build_optimizer
from tfdistx.internals import tensorflow as internals
from tfdistx.tasks import Task, float32


# In the run dir: what a source's preprocessing learnt from the data (a text's vocabulary, data/datasets.py),
# written by the chief as the run starts, and read back by its source in every later process of the run.
PREPROCESSING = "preprocessing"


def build_task(task: Target, source: Optional[DataSource] = None) -> Task:
    """The task (the spec's `task`); task=auto takes the one the source's labels call for (tasks/auto.py)."""
    labels = {"labels": source.labels if source is not None else None} if task.names("labels") else {}
    return task.build(expect=Task, **labels)


def build_source(data: Target, run_dir: Path) -> DataSource:
    """The data source (the spec's `data`); a built-in one reads what its preprocessing learnt in the run dir
    (its `state_dir`)."""
    state = {"state_dir": str(Path(run_dir) / PREPROCESSING)} if data.names("state_dir") else {}
    source = data.build(expect=DataSource, **state)
    return source if data.path.startswith("tfdistx.") else single_examples(source, data.path)  # built-ins do not batch


def data_facts(model: Target, source: DataSource) -> dict:
    """What a model builder that names it takes of the data besides its shapes: `vocab_size`, the token ids' count."""
    return {"vocab_size": source.vocab_size} if source.vocab_size and model.names("vocab_size") else {}


def build_model(model_target: Target, data: Target, feature_spec, num_outputs: int, **given) -> keras.Model:
    """The model (the spec's `model`, for the spec's `data`, named when they
    do not fit), with its weights made. `given`: arguments in place of the
    config's (resplit's `shards`).

    A model whose weights exist when it is constructed (a functional model,
    a `Sequential` with a `keras.Input`) is returned as it is. A subclassed
    model, or a `Sequential` without an `Input`, makes its weights at its
    first call, as Keras' `fit` has it do on the first batch: it is called
    here once, on a batch of zeros of the data's shapes, so that the
    optimizer and the checkpoint are made for the weights it trains (Keras'
    optimizer refuses variables it was not built with). Called in the
    caller's strategy scope: the weights are made where the strategy puts
    them."""
    shape = tuple(feature_spec.shape) if isinstance(feature_spec, tf.TensorSpec) else None
    model = model_target.build(
        expect=keras.Model,
        input_shape=shape,
        feature_spec=feature_spec,
        num_outputs=num_outputs,
        num_classes=num_outputs,
        **given,
    )
    if not model.built:
        try:
            model(zeros_like_examples(feature_spec), training=False)
        except Exception as error:
            raise ConfigError.for_key(
                "model",
                model_target.path,
                f"does not fit data={data.path} (features "
                f"{_describe_features(feature_spec)}): its first call failed: {first_line(error)}",
            ) from None
    return model


def zeros_like_examples(feature_spec, batch: int = 2):
    """A batch of `batch` zero (or empty-string) examples of `feature_spec`
    (a TensorSpec or a dict of them, one example's shape): what a model is
    first called on to make its weights. Dimensions the data leaves open are 1."""

    def zeros(spec):
        shape = [batch, *(1 if size is None else size for size in spec.shape)]
        return tf.fill(shape, "") if spec.dtype == tf.string else tf.zeros(shape, spec.dtype)

    return tf.nest.map_structure(zeros, feature_spec)


def model_from_checkpoint(spec: RunSpec, checkpoint_path: str):
    """The spec's model, rebuilt outside any strategy and with a checkpoint of
    its run restored into it: (model, task, data source, restore status).
    The same for a model whose variables lived on parameter servers or were
    mirrored across workers. Used by the export and by a warm start."""
    source = build_source(spec.data, spec.run_dir)
    task = build_task(spec.task, source)
    feature_spec, label_spec = source.element_spec
    num_outputs = task.num_outputs(label_spec, source.num_classes)
    # The weights are float32 under every precision (Keras keeps float32 master
    # weights): the rebuilt model is float32, whatever training computed in.
    with process_wide.precision("float32"):
        model = build_model(spec.model, spec.data, feature_spec, num_outputs, **data_facts(spec.model, source))
    # Restored with the optimizer too, as training saved it: a weight that a
    # layer keeps in a plain list (wide_deep's table shards) is reachable in
    # the checkpoint only through the optimizer's variables, and a restore of
    # the model alone would silently leave it at its initial value.
    # The optimizer only for the checkpoint's structure.
    _, saved_optimizer, _ = optimizer_for_checkpoint(
        spec.optimizer, spec.trainer.precision, model, LearningRateAtStep(0.0)
    )
    status = resplit.restore(
        {"model": model, "optimizer": saved_optimizer},
        checkpoint_path,
        resplit_for(spec, model, feature_spec, num_outputs, source),
    )  # a checkpoint of another number of ps
    return model, task, source, status


def resplit_for(spec: RunSpec, model, feature_spec, num_outputs: int, source: DataSource) -> Optional[resplit.Resplit]:
    """What re-splits the model's tables from a checkpoint of another number
    of shards (resplit.py); None for a model without such tables."""

    def rebuild(shards):  # the model and optimizer outside any strategy, its tables in `shards` pieces
        with process_wide.precision(spec.trainer.precision):
            given = {**data_facts(spec.model, source), **({} if shards is None else {"shards": shards})}
            plain = build_model(spec.model, spec.data, feature_spec, num_outputs, **given)
        return plain, build_optimizer_for(spec.optimizer, spec.trainer.precision, plain, LearningRateAtStep(0.0))

    return resplit.Resplit(model, rebuild) if resplit.tables(model) else None


def optimizer_for_checkpoint(section: Optimizer, precision: str, model, learning_rate: LearningRateAtStep):
    """(optimizer, what the checkpoint holds for it, the variables it updates
    or None: the model's trainable ones), from the spec's `optimizer` and trainer.precision."""
    sharding.own_shards(model)
    if not sharding.split(model):
        optimizer = build_optimizer_for(section, precision, model, learning_rate)
        return optimizer, optimizer, None
    model_groups = sharding.groups(model)
    variables = sharding.train_variables(model_groups)
    optimizer = build_optimizer_for(section, precision, model, learning_rate, variables)
    try:
        return optimizer, sharding.OptimizerState(optimizer, model_groups), variables
    except ValueError as error:  # a loss-scaled (mixed_float16) optimizer keeps its slots in an inner one
        raise ConfigError.for_key(
            "trainer.precision", precision, f"not with variables split across ps tasks: {error}"
        ) from None


def build_optimizer_for(section: Optimizer, precision: str, model, learning_rate: LearningRateAtStep, variables=None):
    """The configured optimizer (the spec's `optimizer`, under trainer.precision), built for the model's trainable
    variables (or `variables`)."""
    try:
        optimizer = build_optimizer(section, learning_rate, loss_scaling=precision == "mixed_float16")
    except (TypeError, ValueError) as error:  # Keras' answer to an unknown or bad keyword
        raise ConfigError.for_key("optimizer", section.name, f"bad option: {error}") from None
    optimizer.build(model.trainable_variables if variables is None else variables)
    return optimizer


def check_model_takes_data(model, task, source, model_target: Target, data: Target, num_outputs: int) -> tuple:
    """One forward pass on two examples, so that a model and data that do
    not fit together (shapes, dtypes: model=wide_deep on images), or a model
    whose output the task cannot use, are refused as a config error naming
    the spec's `model` and `data`, not as a traceback from deep inside the
    first step. Returns (labels, outputs)."""
    features, labels = next(iter(source.train(None).batch(2)))
    try:
        outputs = float32(model(features, training=False))
        if tuple(outputs.shape[1:]) != (num_outputs,):
            raise ValueError(
                f"it outputs shape {tuple(outputs.shape[1:])} per example; task={task.name} needs {num_outputs}"
            )
        task.loss(labels, outputs)
        return labels, outputs
    except Exception as error:
        raise ConfigError.for_key(
            "model",
            model_target.path,
            f"does not fit data={data.path} (features {_describe_features(features, batched=True)}, "
            f"labels {tuple(labels.shape[1:])} {labels.dtype.name}): {first_line(error)}",
        ) from None


def _describe_features(features, batched: bool = False) -> str:
    """Features (tensors of a batch, or one example's specs) as shapes and dtypes of one example."""
    one = lambda shape: tuple(shape[1:] if batched else shape)  # noqa: E731
    if isinstance(features, dict):
        return "{" + ", ".join(f"{k}: {one(v.shape)} {v.dtype.name}" for k, v in features.items()) + "}"
    return f"{one(features.shape)} {features.dtype.name}"


def rng_states(model) -> list:
    """The states of the model's Keras SeedGenerators (dropout masks and the
    like). tf.train.Checkpoint cannot reach them through the layers (a
    SeedGenerator is not a TF trackable), so a resumed run would replay the
    first masks again: they are checkpointed explicitly, for exact resume."""
    return [v for v in model.non_trainable_variables if internals.is_seed_generator_state(v)]

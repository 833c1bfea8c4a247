"""What XLA makes of a run's model and step, found before the first step.

`trainer.jit_compile=auto` compiles on CPUs only a model made of Dense
layers (core/compute.py says why). What a model is made of is read from
the built model itself, not from its list of layers, which leaves out a
weight that the model (or a custom layer beside its sublayers) holds:
- every weight, by the class of the layer that holds it (weighted_layer_kinds);
- every op of its forward pass, traced once and not run (forward_op_types).

A step that XLA is to compile is first lowered to XLA's HLO, for a batch
of the real shapes and dtypes, without running it (compile_or_fall_back):
a step XLA cannot compile (an op without an XLA kernel, a shape known only
at run time) then trains without XLA under `auto`, said in one warning,
and is refused in one line under `trainer.jit_compile=true`, instead of
failing at its first step with "Graph execution error".
"""

import logging
from typing import Tuple

import tensorflow as tf

from tfdistx.core import compute
from tfdistx.core.errors import ConfigError
from tfdistx.internals import tensorflow as internals

log = logging.getLogger(__name__)


def decide(trainer, checkpoint, row, gpus: bool, model, feature_spec) -> Tuple[bool, int]:
    """(compile with XLA?, steps per XLA call) for the built model, said in
    one line of the log (the rule behind it is --plan's); N > 1 steps per
    XLA call where `auto` leaves XLA off is refused. `trainer`, `checkpoint`:
    the run spec's; `row`: the concrete strategy's row."""
    accumulate, asked = trainer.accumulate_steps, trainer.jit_compile
    layers = weighted_layer_kinds(model)
    ops = forward_op_types(model, feature_spec) if compute.decided_by_the_model(asked, row, gpus, accumulate) else ()
    jit, why = compute.decide_jit(asked, row, gpus=gpus, layers=layers, ops=ops, accumulate_steps=accumulate)
    per_call, per_call_why = compute.decide_steps_per_xla_call(
        trainer.steps_per_xla_call,
        jit,
        row,
        trainer.steps_per_loop,
        compute.loop_periods(trainer, checkpoint),
        gpus=gpus,
        layers=layers,
        ops=ops,
        accumulate_steps=accumulate,
    )
    refused = compute.steps_per_xla_call_problem(trainer.steps_per_xla_call, jit, why)
    if refused:
        raise ConfigError([refused])
    log.info("compute %s; XLA %s; steps per XLA call %s", trainer.precision, why, per_call_why)
    return jit, per_call


def weighted_layer_kinds(model) -> set:
    """Class names of the layers that hold the model's weights, each weight
    counted for the layer that holds it itself: a Dense layer's kernel is a
    Dense weight; a weight that a model or a custom layer adds beside its
    sublayers is that model's or layer's (a custom class is its own kind)."""
    kinds = set()
    for layer in internals.sublayers(model, include_self=True, recursive=True):
        inside = {
            id(weight)
            for sublayer in internals.sublayers(layer, include_self=False, recursive=False)
            for weight in sublayer.weights
        }
        if any(id(weight) not in inside for weight in layer.weights):
            kinds.add(type(layer).__name__)
    return kinds


def forward_op_types(model, feature_spec) -> set:
    """The op types of the model's forward pass in training (of the functions
    it calls too), traced for a batch of `feature_spec` (one example's
    specs) and not run: no variable changes."""
    batch_spec = tf.nest.map_structure(lambda spec: tf.TensorSpec([None, *spec.shape], spec.dtype), feature_spec)
    graph = (
        tf.function(lambda features: model(features, training=True), autograph=False)
        .get_concrete_function(batch_spec)
        .graph.as_graph_def()
    )
    return {node.op for node in graph.node} | {
        node.op for function in graph.library.function for node in function.node_def
    }


def compile_or_fall_back(run, runner) -> None:
    """Before the first step, whether XLA compiles the step the run is to
    compile. If it cannot: refused under `trainer.jit_compile=true` (and
    under `auto` with N > 1 steps per XLA call asked for), else the runner
    trains without XLA, as with `false`, and the chief says so once."""
    if not run.jit_compile or run.strategy_name == "tpu":  # a TPU compiles every step its own way
        return
    failure = runner.xla_failure(replica_batch_spec(run.per_replica_batch, run.source.element_spec))
    if failure is None:
        return
    trainer = run.spec.trainer
    if trainer.jit_compile is True:
        raise ConfigError.for_key(
            "trainer.jit_compile", True, f"XLA cannot compile this run's step: {failure.rstrip('.')}: use false or auto"
        )
    problem = compute.steps_per_xla_call_problem(
        trainer.steps_per_xla_call,
        False,
        "off: it cannot compile this run's step",
        fix="set trainer.steps_per_xla_call=1 or auto",
    )
    if problem:
        raise ConfigError([problem])
    if run.placement.is_chief:
        log.warning("trainer.jit_compile=auto: XLA cannot compile this run's step (%s): training without XLA", failure)
    runner.update.without_xla()
    run.jit_compile, run.steps_per_xla_call = False, 1


def replica_batch_spec(per_replica_batch: int, element_spec) -> tuple:
    """The specs of one replica's batch of the training data (one example's `element_spec`): what the step is
    compiled for."""
    return tf.nest.map_structure(lambda spec: tf.TensorSpec([per_replica_batch, *spec.shape], spec.dtype), element_spec)

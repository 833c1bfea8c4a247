"""A servable model: a TensorFlow SavedModel in <run dir>/export/.

Why a SavedModel and not a `.keras` file: plain TensorFlow
(`tf.saved_model.load`) and TF Serving load it with none of the model's
Python code — no custom layers to register, no tfdistx, no Keras version to
match — and its `serving_default` signature returns what the task calls a
prediction (probabilities, classes, values), not only raw logits. Written
with Keras' own ExportArchive.

    tfdistx export RUN_DIR [--step N] [--out DIR]   # any kept checkpoint, afterwards
"""

import logging
import os
from typing import Optional

import keras
import tensorflow as tf

from tfdistx.data.sources import Served
from tfdistx.core.run_spec import RunSpec
from tfdistx.engine.parts import model_from_checkpoint
from tfdistx.rundir import new_directory

log = logging.getLogger(__name__)


def export_checkpoint(spec: RunSpec, checkpoint_path: str, directory: str, protected=()) -> str:
    """Rebuild the model outside any strategy, load a checkpoint into it and
    write the SavedModel: the same for a model whose variables lived on
    parameter servers or were mirrored across workers."""
    # float32, and restored with the optimizer's structure (parts.model_from_checkpoint says why)
    model, task, source, status = model_from_checkpoint(spec, checkpoint_path)
    status.expect_partial()  # the step counter, RNG states and objective state are the run's, not the model's
    export_saved_model(model, task, source.element_spec[0], directory, protected, served=source.served)
    log.info("exported %s to %s", os.path.basename(checkpoint_path), directory)
    return directory


def export_saved_model(
    model, task, feature_spec, directory: str, protected=(), served: Optional[Served] = None
) -> None:
    """Write `model` (variables local to this process) with the task's
    serving outputs. `directory` must be new, empty or an earlier export,
    which is kept aside once the new one is whole; anything else there, or
    a path in or over `protected`, is refused (rundir.new_directory).
    `served`: what the source does to its raw examples before the model
    (data/sources.Served), done again here: the export takes the raw
    features (strings, pixels, a table's columns by name)."""
    with new_directory("--out", directory, protected) as tmp:
        if served is not None:
            signature, before = served.features, served.layer
        else:
            signature, before = tf.nest.map_structure(_batched, feature_spec), None
            if isinstance(feature_spec, dict):  # inputs named after the features
                signature = {name: tf.TensorSpec(spec.shape, spec.dtype, name=name) for name, spec in signature.items()}
        archive = keras.export.ExportArchive()
        archive.track(model)
        if before is not None:
            archive.track(before)  # a TextVectorization's vocabulary: a lookup table the export must hold

        def serve(features):
            return task.serving_outputs(model(before(features) if before is not None else features, training=False))

        archive.add_endpoint("serve", serve, input_signature=[signature])
        archive.write_out(tmp, verbose=False)


def _batched(spec: tf.TensorSpec) -> tf.TensorSpec:
    # One-tensor features carry no name of their own (a source's pipeline yields (tensor, label)):
    # the serving input is called `features`, as docs/trained-model.md says.
    return tf.TensorSpec([None, *spec.shape], spec.dtype, name="features")

"""A servable model: a TensorFlow SavedModel in <run dir>/export/.

Why a SavedModel and not a `.keras` file: plain TensorFlow
(`tf.saved_model.load`) and TF Serving load it with none of the model's
Python code — no custom layers to register, no tfdistx, no Keras version to
match — and its `serving_default` signature returns what the task calls a
prediction (probabilities, classes, values), not only raw logits. Written
with Keras' own ExportArchive.

    tfdistx export RUN_DIR [--step N] [--out DIR]   # any kept checkpoint, afterwards
"""

import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional

import keras
import tensorflow as tf

from tfdistx.rundir import new_directory


def export_saved_model(model, task, feature_spec, directory: str, protected=()) -> None:
    """Write `model` (variables local to this process) with the task's
    serving outputs. `directory` must be new, empty or an earlier export,
    which is kept aside once the new one is whole; anything else there, or
    a path in or over `protected`, is refused (rundir.new_directory)."""
    with new_directory("--out", directory, protected) as tmp:
        signature = tf.nest.map_structure(_batched, feature_spec)
        if isinstance(feature_spec, dict):  # inputs named after the features
            signature = {name: tf.TensorSpec(spec.shape, spec.dtype, name=name) for name, spec in signature.items()}
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.add_endpoint("serve", lambda features: task.serving_outputs(model(features, training=False)),
                             input_signature=[signature])
        archive.write_out(tmp, verbose=False)


def _batched(spec: tf.TensorSpec) -> tf.TensorSpec:
    # One-tensor features carry no name of their own (a source's pipeline yields (tensor, label)):
    # the serving input is called `features`, as the README says.
    return tf.TensorSpec([None, *spec.shape], spec.dtype, name="features")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="tfdistx export", description="Write a SavedModel from a run's checkpoint.")
    parser.add_argument("run_dir", help="a run directory (with .hydra/config.yaml and checkpoints/)")
    parser.add_argument("--step", type=int, default=None, help="the checkpoint saved at this step (default: the newest)")
    parser.add_argument("--out", default=None, help="where to write the SavedModel: a new directory, or an earlier export, "
                        "which is kept aside (default: RUN_DIR/export, or RUN_DIR/export-step-N with --step)")
    args = parser.parse_args(argv)

    from tfdistx.engine import checkpointing
    from tfdistx.cli import refuse
    from tfdistx.config.compose import saved_config
    from tfdistx.config.errors import ConfigError
    from tfdistx.engine.fit import build_task_and_data, export_checkpoint

    try:
        cfg = saved_config(args.run_dir)
        directory = cfg.checkpoint.dir or str(Path(args.run_dir) / "checkpoints")
        path = checkpointing.find(directory, args.step)
        task, source = build_task_and_data(cfg)
        default = "export" if args.step is None else f"export-step-{args.step}"  # the run's own export stays the final step's
        target = export_checkpoint(cfg, task, source, path, args.out or str(Path(args.run_dir) / default),
                                   protected=[args.run_dir, directory])
    except ConfigError as error:
        refuse(error)
    print(f"tfdistx: exported {os.path.basename(path)} to {target}", file=sys.stderr)
    return 0

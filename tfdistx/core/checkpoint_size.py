"""A checkpoint's size and the time a save takes, said before the run
(`--plan`), and the grace a preemption must give the run to save
(`cluster.preemption_grace`: the local launcher's wait, the pods'
terminationGracePeriodSeconds, the Slurm script's --signal lead). No
TensorFlow and no Hydra: plain data and the files on disk.

The size comes from the model's variable shapes where the config gives them
without building the model (model=mlp and model=cnn on data of a known
shape: the optimizer's slots are so many copies of the trained weights,
core/optimizers.SLOTS), else from the newest checkpoint on disk (a rerun,
a resumed job: exact). Another model's is known once the run builds it
(its log says it; a rerun's `--plan` reads its checkpoints): building it
here would start TensorFlow, about 4 s before the plan could print.

The time is the size at a write rate: the one the run directory's last run
measured (summary.json: its fastest save), else DEFAULT_WRITE_RATE, a rate
stated beside the estimate (network storage's order; a local disk into the
page cache writes several times faster).
"""

import json
import math
import os
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from tfdistx.checkpoint_files import on_disk, step_of
from tfdistx.core import optimizers

DEFAULT_WRITE_RATE = 200e6  # bytes a second, when no save of this run dir was measured
MEASURED_FROM_BYTES = 50e6  # a measured rate counts from a save this large (a small one is its overheads)
FLOAT32 = 4  # bytes: variables stay float32 under mixed precision (its computations are half)
# The grace a preemption gives the run, unless the user sets it: never below what tfdistx gave before it
# derived one (cluster.preemption_grace's 60 s; the Slurm script's notice, 120 s: commands/slurm.py).
LEAST_GRACE = 60
# Besides the saves: the loop reaching its boundary (a call of trainer.steps_per_loop steps) and the process leaving.
GRACE_MARGIN = 30


@dataclass(frozen=True)
class Estimate:
    """What a checkpoint holds, and the time a save of it takes."""

    total: int  # bytes of a checkpoint
    source: str  # where the size comes from
    weights: Optional[int] = None  # bytes of the model's variables (None: read from disk, not split)
    slots: Optional[int] = None  # bytes of the optimizer's slots
    slots_per_weight: Optional[int] = None
    optimizer: str = ""
    rate: float = DEFAULT_WRITE_RATE  # bytes a second
    rate_source: str = "a stated rate"

    @property
    def seconds(self) -> float:
        return self.total / self.rate


def estimate(config: Mapping[str, Any], checkpoint_dir: Optional[str] = None, run_dir: Optional[str] = None):
    """The Estimate for a resolved config (plain mappings); None when its size cannot be known yet."""
    shapes = model_shapes(config)
    optimizer = dict(config.get("optimizer") or {})
    slots = optimizers.slots_per_weight(optimizer)
    shown = optimizers.shown_name(optimizer)
    found = _on_disk(checkpoint_dir)
    rate, rate_source = _measured_rate(run_dir)
    if shapes is not None:
        weights = sum(math.prod(shape) for shape in shapes) * FLOAT32
        # Adafactor's factored slots, an optimizer of the user's: the checkpoint is at least the weights
        kept = weights * (slots or 0)
        if found:
            return Estimate(found[0], found[1], weights, kept, slots, shown, rate, rate_source)
        source = f"model={_model_name(config)}'s shapes" + ("" if slots is not None else f"; {shown}'s slots not known")
        return Estimate(weights + kept, source, weights, kept, slots, shown, rate, rate_source)
    if found:
        return Estimate(found[0], found[1], optimizer=shown, rate=rate, rate_source=rate_source)
    return None


def grace_seconds(found: Optional[Estimate], least: int = LEAST_GRACE) -> int:
    """The seconds a preemption gives the run to save, for the estimate `found` (at least `least`)."""
    return least if found is None else grace_for(found.seconds, least)


def grace_for(save_seconds: float, least: int = LEAST_GRACE) -> int:
    """The grace a save of `save_seconds` needs: a save in flight may have to
    finish first, then the preemption's own (two saves), and the margin."""
    return max(least, math.ceil(2 * save_seconds + GRACE_MARGIN))


def shown(found: Optional[Estimate], model: str, background: bool = True) -> List[str]:
    """--plan's lines (`background`: checkpoint.background)."""
    if found is None:
        return [
            f"checkpoint    its size is known once the model is built (model={model}): the run's log says it at its "
            "first periodic save (summary.json: checkpoint.bytes), and a rerun's --plan reads its checkpoints"
        ]
    parts = ""
    if found.weights is not None:
        slots = (
            f"{found.optimizer}'s slots {_size(found.slots)} ({found.slots_per_weight} per weight)"
            if found.slots_per_weight is not None
            else f"{found.optimizer}'s slots not counted"
        )
        parts = f": the model's variables {_size(found.weights)}, {slots}, float32"
    return [
        f"checkpoint    {_size(found.total)}{parts} ({found.source})",
        f"  save        about {found.seconds:.1f} s at {found.rate / 1e6:.0f} MB/s ({found.rate_source}); "
        + (
            "the steps wait only for a snapshot, the files are written in the background"
            if background
            else "the steps wait for each save (checkpoint.background=false)"
        ),
    ]


def model_shapes(config: Mapping[str, Any]) -> Optional[List[Tuple[int, ...]]]:
    """The trained weights' shapes of model=mlp or model=cnn, in creation
    order, when the data's image shape and classes are in the config (the
    synthetic images'); else None."""
    model, data = config.get("model") or {}, config.get("data") or {}
    image, classes = data.get("image_shape"), data.get("num_classes")
    if not image or not classes:
        return None
    target = model.get("_target_")
    if target == "tfdistx.models.mlp":
        return _dense([math.prod(int(size) for size in image), *model.get("hidden_units", [128]), int(classes)])
    if target == "tfdistx.models.cnn" and len(image) == 3:
        height, width, channels = (int(size) for size in image)
        shapes = []
        for filters in model.get("filters", [32, 64]):
            shapes += [(3, 3, channels, int(filters)), (int(filters),)]
            height, width, channels = height // 2, width // 2, int(filters)  # "same" convolution, 2x2 pooling
        return shapes + _dense([height * width * channels, int(model.get("dense_units", 128)), int(classes)])
    return None


def _dense(widths: Sequence[int]) -> List[Tuple[int, ...]]:
    shapes = []
    for width, units in zip(widths, widths[1:]):
        shapes += [(int(width), int(units)), (int(units),)]
    return shapes


def _model_name(config: Mapping[str, Any]) -> str:
    target = str((config.get("model") or {}).get("_target_", ""))
    return target.rpartition(".")[2] if target.startswith("tfdistx.models.") else target


def _on_disk(checkpoint_dir: Optional[str]) -> Optional[Tuple[int, str]]:
    """(bytes, source) of the newest checkpoint in `checkpoint_dir`, when there is one."""
    if not checkpoint_dir or not os.path.isdir(checkpoint_dir):
        return None
    paths = on_disk(checkpoint_dir)
    if not paths:
        return None
    newest = paths[-1]
    folder, name = os.path.split(newest)
    total = sum(
        os.path.getsize(os.path.join(folder, entry))
        for entry in os.listdir(folder)
        if entry.startswith(name + ".") and step_of(entry) == step_of(newest)
    )
    return total, f"{name} on disk"


def _measured_rate(run_dir: Optional[str]) -> Tuple[float, str]:
    """The write rate the run directory's last run measured (its summary's fastest save), else the stated default."""
    try:
        with open(os.path.join(run_dir, "summary.json")) as file:
            saved = json.load(file).get("checkpoint") or {}
        fastest, size = float(saved["save_sec_min"]), float(saved["bytes"])
    except (TypeError, OSError, ValueError, KeyError, AttributeError):
        return DEFAULT_WRITE_RATE, "a stated rate: network storage's order, a local disk writes faster"
    if size < MEASURED_FROM_BYTES or fastest <= 0:
        return DEFAULT_WRITE_RATE, "a stated rate: network storage's order, a local disk writes faster"
    return size / fastest, "measured by the last run in this run dir"


def _size(count: int) -> str:
    return f"{count / 1e9:.2f} GB" if count >= 1e9 else f"{count / 1e6:.0f} MB" if count >= 1e6 else f"{count:,} bytes"

"""Every Keras optimizer (optimizer.name's shortcuts, core/optimizers.py)
trains the default MLP (784-128-10) under mirrored 1x2 and resumes exactly,
its slots restored from the checkpoint. In process, on real strategies
(engine_helpers); three optimizers of different kinds in the default run
(Lion: one moment; Muon: Newton-Schulz steps and an Adam part; Adafactor:
factored second moments), the others with -m slow."""

import numpy as np
import pytest

from engine_helpers import whole_and_resumed
from tfdistx.core import optimizers

MIRRORED = [
    "strategy=mirrored",
    "cluster=1x2",
    "trainer.deterministic=true",
    "checkpoint.every_steps=25",
    "trainer.log_every=25",
    "trainer.steps_per_loop=25",
]


DEFAULT_RUN = ("lion", "muon", "adafactor")


@pytest.mark.parametrize(
    "name",
    [
        name if name in DEFAULT_RUN else pytest.param(name, marks=pytest.mark.slow)
        for name in sorted(optimizers.CLASSES)
    ],
)
def test_every_keras_optimizer_trains_under_mirrored_and_resumes_exactly(tmp_path, name):
    """The default MLP (784-128-10) for 50 steps on two replicas, whole and
    stopped at 25 then resumed: the same weights bit for bit, so the slots
    (moments, accumulators, Muon's momentum) came back from the checkpoint."""
    whole, resumed = whole_and_resumed(tmp_path, [*MIRRORED, f"optimizer.name={name}"], stop_at=25, steps=50)
    assert whole.summary["step"] == 50 and np.isfinite(whole.metrics[-1]["loss"])
    assert resumed.summary["weights_sha256"] == whole.summary["weights_sha256"]
    assert [m["loss"] for m in resumed.metrics] == [m["loss"] for m in whole.metrics]

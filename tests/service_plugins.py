"""A data source for tests/test_data_service.py: in-memory examples that
carry their own index (tfdistx.data.in_memory, so that under data.service
the dispatcher hands out batch indices of the run's one seeded order).
Counted by user_plugins.counting_model."""

import numpy as np

from tfdistx.data import in_memory


def indexed_arrays(examples: int = 512, features: int = 4):
    rng = np.random.default_rng(0)
    x = {
        "x": rng.standard_normal((examples, features)).astype(np.float32),
        "index": np.arange(examples, dtype=np.int64),
    }
    y = (x["x"][:, 0] > 0).astype(np.int64)
    return in_memory((x, y), (x, y), num_classes=2, train_examples=examples)

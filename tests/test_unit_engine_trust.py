"""Issue 32's checks that need a user's data source built (in-process, -m
unit): what its pipeline yields, and whether it has an eval split, are
known only once its function has run; refused in one line, before a model
is built or a step trained."""

import pytest

from config_helpers import PREFIX
from engine_helpers import train
from tfdistx.core.errors import ConfigError

pytestmark = pytest.mark.unit

OWN = ["model._target_=user_plugins.tiny_model"]


def refused_in_the_engine(tmp_path, *overrides) -> list:
    with pytest.raises(ConfigError) as caught:
        train(tmp_path / "run", *OWN, *overrides, sizes=())
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    return caught.value.lines()


def test_a_pipeline_that_batches_is_refused_naming_the_data_target(tmp_path):
    assert refused_in_the_engine(tmp_path, "data._target_=user_plugins.batched_data") == [
        PREFIX
        + "data._target_='user_plugins.batched_data': its pipeline yields batches (the first dimension of every part "
        "of its elements is of unknown size: (None, 8), (None,)); a pipeline function must yield single examples, "
        "which tfdistx batches: remove its .batch()"
    ]


@pytest.mark.parametrize(
    "asked, line",
    [
        (
            "checkpoint.keep_best=true",
            "checkpoint.keep_best=True: keeps the best checkpoint by trainer.objective=eval/accuracy, and ",
        ),
        (
            "trainer.early_stopping.patience=2 trainer.eval_every=20",
            "trainer.early_stopping.patience=2: counts evaluations of trainer.objective=eval/accuracy, and ",
        ),
    ],
)
def test_an_evaluated_objective_on_a_source_without_eval_data_is_refused(tmp_path, asked, line):
    assert refused_in_the_engine(tmp_path, "data._target_=user_plugins.train_only_data", *asked.split()) == [
        PREFIX
        + line
        + "data=user_plugins.train_only_data has no eval split (its DataSource's eval is None): give it an eval "
        "pipeline, or a training metric as the objective (e.g. trainer.objective=loss)"
    ]

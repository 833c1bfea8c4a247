"""Numbers and ranges are checked before TensorFlow starts: each bad value
is refused with the key, the value and what is allowed. In-process: the
same compose-and-validate the CLI calls, no subprocess."""

import pytest

from tfdistx.config import schema
from tfdistx.config.compose import compose_and_validate
from tfdistx.config.errors import ConfigError

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module", autouse=True)
def registered():
    schema.register()


def refusal(*overrides) -> str:
    with pytest.raises(ConfigError) as caught:
        compose_and_validate([*overrides, "hydra.run.dir=/tmp/never-made"], notes=False)
    assert len(caught.value.lines()) == 1, caught.value.lines()
    return caught.value.lines()[0]


@pytest.mark.parametrize("overrides, said", [
    (["+trainer.foo=1"], "trainer.foo=1: trainer has no such key; its keys: steps"),
    (["optimizer.beta_1=2"], "optimizer.beta_1=2: a decay rate"),
    (["optimizer.epsilon=-1"], "optimizer.epsilon=-1: must be a positive"),
    (["optimizer.min_lr_ratio=-3"], "optimizer.min_lr_ratio=-3: a fraction of optimizer.lr"),
    (["optimizer=sgd", "optimizer.nesterov=maybe"], "optimizer.nesterov='maybe': allowed: true, false"),
    (["optimizer=sgd", "optimizer.momentum=1"], "optimizer.momentum=1"),
    (["optimizer.lr=1e308"], "optimizer.lr=1e+308: must be a positive, finite number"),
    (["cluster.base_port=70000"], "cluster.base_port=70000: a TCP port"),
    (["task.top_k=0"], "task.top_k=0: must be a whole number, at least 1"),
    (["logger=wandb", "logger.wandb.init_timeout=-1"], "logger.wandb.init_timeout=-1: seconds, more than 0"),
    (["data.batch_size=1e9"], "data.batch_size=1000000000.0: must be a positive integer"),
    (["trainer.steps=1e20"], "trainer.steps='1e20'"),
    (["trainer.steps=4611686018427387905"], "at most 4611686018427387904"),
    (["trainer.seed=-1"], "trainer.seed=-1: must be a whole number from 0 to 4294967295"),
    (["task.metrics=[nope]"], "task.metrics=['nope']: task=classification offers accuracy, top_k_accuracy"),
    (["task=binary", "task.metrics=[auc,nope]"], "task.metrics=['auc', 'nope']: task=binary offers auc, accuracy, log_loss"),
    (["trainer.steps=${nope.nope}"], "trainer.steps='${nope.nope}': Interpolation key 'nope.nope' not found"),
    (["trainer.steps=${oc.env:TFDISTX_TEST_UNSET}"], "Environment variable 'TFDISTX_TEST_UNSET' not found"),
])
def test_a_bad_value_is_one_line_naming_it(overrides, said):
    line = refusal(*overrides)
    assert line.startswith("tfdistx: invalid config: ") and said in line, line


def test_an_empty_run_dir_is_refused():
    with pytest.raises(ConfigError) as caught:
        compose_and_validate(["hydra.run.dir="], notes=False)
    assert "hydra.run.dir='': must name a directory" in caught.value.lines()[0]


def test_each_built_in_task_offers_the_metrics_the_config_checks_against():
    from hydra.utils import get_class  # imports the task modules (TensorFlow)

    from tfdistx.config.tasks import METRICS

    for target, names in METRICS.items():
        assert tuple(get_class(target).AVAILABLE) == names, target

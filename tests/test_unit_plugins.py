"""Each plug-in declared once (issue 33): a strategy is its row of
config/strategies.py (and its builder), a task its class and its YAML, a
data source its function and its YAML; the config side reads those facts
and still refuses bad input in one line before TensorFlow starts."""

import pytest
from omegaconf import OmegaConf

from config_helpers import PREFIX, compose_ok, refused
from tfdistx.config import strategies, userconf

pytestmark = pytest.mark.unit

# a cluster each strategy can run on
FITS = {"multiworker": ["cluster=2x1"], "parameter_server": ["cluster=ps1w2"]}


# -- strategies: a row of the table is the `strategy=NAME` option --------------------


@pytest.mark.parametrize("name", strategies.NAMES)
def test_each_strategy_composes_as_its_row_says(tmp_path, name):
    cfg = compose_ok(tmp_path / "run", f"strategy={name}", *FITS.get(name, []))
    assert OmegaConf.to_container(cfg.strategy) == strategies.nodes()[name]


def test_every_option_a_row_declares_composes_and_is_checked(tmp_path):
    """An option's key is in the composed group (so `strategy.KEY=V` needs
    no `+`), and a value outside its allowed ones is refused in one line."""
    cfg = compose_ok(tmp_path / "run", "strategy=mirrored", "strategy.cross_device_ops=reduction_to_one")
    assert cfg.strategy.cross_device_ops == "reduction_to_one"
    assert refused(tmp_path / "run", "strategy=multiworker", "cluster=2x1", "strategy.communication=carrier_pigeon") == [
        PREFIX + "strategy.communication='carrier_pigeon': allowed: auto, ring, nccl"]


@pytest.fixture
def own_conf(tmp_path, monkeypatch):
    monkeypatch.setenv(userconf.ENV, "")  # recorded, so the test's own value is undone after it
    root = tmp_path / "conf"
    (root / "strategy").mkdir(parents=True)
    monkeypatch.setenv(userconf.ENV, str(root))
    return root / "strategy"


def test_a_users_strategy_file_named_like_a_row_is_refused(own_conf, tmp_path):
    """The rows are options though no file holds them: a user's
    strategy/mirrored.yaml would replace one in every run, as a user's
    model/mlp.yaml would."""
    shadow = own_conf / "mirrored.yaml"
    shadow.write_text("name: mirrored\ncross_device_ops: nccl\n")
    assert refused(tmp_path / "run", "trainer.steps=5") == [
        PREFIX + f"--config-dir (TFDISTX_CONFIG_PATH)={str(shadow)!r}: has the name of the shipped option strategy=mirrored, which it "
                 "would replace in every run: rename it, e.g. strategy/my_mirrored.yaml (and pick it with strategy=my_mirrored)"]
    assert [o["refused"] is not None for o in userconf.options()["strategy"]] == [True]


def test_a_users_own_strategy_option_composes(own_conf, tmp_path):
    (own_conf / "reduced.yaml").write_text("name: mirrored\ncross_device_ops: reduction_to_one\nall_reduce_dtype: bfloat16\n")
    cfg = compose_ok(tmp_path / "run", "strategy=reduced", "cluster=1x2")
    assert OmegaConf.to_container(cfg.strategy) == {"name": "mirrored", "cross_device_ops": "reduction_to_one", "all_reduce_dtype": "bfloat16"}

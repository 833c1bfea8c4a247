"""`python -m tfdistx --help`, in-process (-m unit): tfdistx fills its help
template itself, with the run's groups, rather than through Hydra's app
help, which lists Hydra's own groups too (and copies its whole config
repository for each listing: seconds). The same text Hydra prints."""

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode

from tfdistx import cli
from tfdistx.commands import run
from tfdistx.config import userconf
from tfdistx.core.paths import config_dir
from tfdistx.internals import hydra as hydra_internals

pytestmark = pytest.mark.unit


def printed(capsys, *argv) -> str:
    """What `python -m tfdistx --help ARGV` prints (given its arguments, cli.main returns)."""
    cli.main(["--help", *argv])
    return capsys.readouterr().out


def test_help_is_the_text_hydras_app_help_prints_from_the_same_template(capsys):
    ours = printed(capsys)
    # What Hydra's app_help prints, without the logging it configures (into this test's captured stream)
    with initialize_config_dir(config_dir=str(config_dir()), version_base=None, job_name="tfdistx"):
        hydra = GlobalHydra.instance().hydra
        cfg = hydra.compose_config("config", overrides=[], run_mode=RunMode.RUN, with_log_configuration=False)
        hydras = hydra.get_help(cfg.hydra.help, cfg, hydra_internals.args_parser(), resolve=False)
    assert ours == hydras + "\n"  # Hydra prints it
    assert "model: cnn, mlp, resnet, text, wide_deep\n" in ours and "hydra/" not in ours


def test_help_lists_the_groups_of_a_users_config_dir(tmp_path, capsys, monkeypatch):
    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "conf" / "data" / "digits.yaml").write_text("_target_: tfdistx.data.synthetic\nnum_classes: 5\n")
    monkeypatch.setenv(userconf.ENV, str(tmp_path / "conf"))
    assert "data: cifar10, csv, digits, fashion_mnist, mnist, synthetic" in printed(capsys)


@pytest.mark.parametrize("flag", ["--plann", "--halp", "-x"])
def test_a_flag_tfdistx_does_not_know_is_one_line_naming_it_and_the_flags_there_are(capsys, flag):
    """Not Hydra's argparse usage (its program named `__main__.py`, its own flags) and its error line."""
    with pytest.raises(SystemExit) as leaving:
        cli.main([flag, "trainer.steps=3"])
    said = capsys.readouterr()
    assert leaving.value.code == 2 and said.out == ""
    assert said.err.splitlines() == [
        f"tfdistx: invalid config: flag='{flag}': not a flag of tfdistx; the flags are {run.FLAGS}"
    ], said.err
    assert "--plan" in run.FLAGS and "--config-dir" in run.FLAGS

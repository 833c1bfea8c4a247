"""No value can rewrite what an export writes (issue 60, item 1): newlines,
quotes, `---`, `$()`, backticks, `#`, a backslash and the other line breaks
of YAML (U+0085, U+2028) go through every field of `tfdistx export
jobset|trainjob|tfjob|slurm` (overrides, `hydra.run.dir` among them,
`--config-dir`, TFDISTX_CONFIG_PATH, `--out`), and the result is parsed: the
YAML is exactly the documents of its kind, each value intact in the
containers' args and environment; the Slurm script passes `bash -n` and,
run with a fake `srun` and `scontrol` on PATH, hands the step the very
overrides and runs no command a value holds. What a flag with a grammar of
its target's cannot hold (`--image`, `--name`, `--partition`, `--time`,
`--mem` ...) is refused in one line, exit 2, nothing printed."""

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from fake_slurm import run_script
from tfdistx import cli
from tfdistx.config import userconf
from tfdistx.core import elastic

pytestmark = pytest.mark.unit

# A value that, pasted into a line, would end it and start a YAML document, a shell command, a comment.
NASTY = (
    "x\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: evil}\nspec: {containers: [{name: c, image: evil:1}]}\n"
    '---\n# $(touch PWNED1) `touch PWNED2` "q" #c \\e \u2028 \x85 \r end'
)


def run_dir_override(tmp_path) -> str:
    """hydra.run.dir with the nasty value in its name (a quote inside, escaped as Hydra's), in the test's own tmp
    dir: the Slurm script run here makes the run dir (an agents' run's secret goes into it)."""
    return f"hydra.run.dir='{tmp_path}/run-" + NASTY.replace("'", "\\'") + "\\''"


OTHERS = [
    "logger.wandb.project='p " + NASTY.replace("'", "\\'") + "'",
    'logger.mlflow.experiment="it\'s --- `touch PWNED3` $(touch PWNED4)"',
]
KINDS = {"tfjob": ["TFJob"], "jobset": ["JobSet", "NetworkPolicy"], "trainjob": ["ClusterTrainingRuntime", "TrainJob"]}


@pytest.fixture
def nasty_dirs(tmp_path, monkeypatch):
    """(a --config-dir, a TFDISTX_CONFIG_PATH) whose names hold
    the nasty characters (':' aside: the path's separator)."""
    monkeypatch.setenv(userconf.ENV, "")  # recorded: what the commands add is undone after the test
    name = "conf " + NASTY.replace("/", "|").replace(":", ";")
    flag, env = tmp_path / f"flag-{name}", tmp_path / f"env-{name}"
    for directory in (flag, env):
        (directory / "experiment").mkdir(parents=True)
    monkeypatch.setenv(userconf.ENV, str(env))
    return str(flag), str(env)


def export(capsys, *args):
    """(exit code, stdout, stderr) of `tfdistx export ARGS`, in-process."""
    with pytest.raises(SystemExit) as leaving:
        cli.main(["job", *args])
    out, err = capsys.readouterr()
    return leaving.value.code, out, err


def containers(documents):
    """Every container of the documents, wherever the kind holds its pod templates."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            if "containers" in node and isinstance(node["containers"], list):
                found.extend(node["containers"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(documents)
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_no_value_rewrites_a_kubernetes_manifest(capsys, tmp_path, nasty_dirs, kind):
    flag_dir, env_dir = nasty_dirs
    overrides = ["strategy=multiworker", "cluster=2x1", run_dir_override(tmp_path), *OTHERS]
    argv = [kind, *overrides, "--config-dir", flag_dir, "--image", "registry.example.com:5000/team/tfdistx:0.1"]
    code, out, err = export(capsys, *argv, "--name", "ok", "--volume", "hostPath:/srv/" + NASTY)
    assert code == 0, err
    documents = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in documents] == KINDS[kind]  # no document the values made
    pods = containers(documents)
    assert pods, out
    for container in pods:
        args = container["args"]
        assert args[:2] == ["--config-dir", flag_dir] and args[2 : 2 + len(overrides)] == overrides, args
        assert {"name": userconf.ENV, "value": env_dir} in container["env"]
    # the header: one comment line, the command that made it, which a shell reads back word for word
    header = [line for line in out.splitlines() if line.startswith("#")]
    assert len(header) == 1 and out.startswith(header[0] + "\n")
    words = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {header[0][2:]}"], capture_output=True, check=True, cwd=tmp_path
    ).stdout
    made_by = ["tfdistx", "job", *argv, "--name", "ok", "--volume", "hostPath:/srv/" + NASTY]
    assert words.split(b"\0")[:-1] == [word.encode() for word in made_by]
    assert not list(tmp_path.glob("PWNED*"))


@pytest.mark.parametrize(
    "flag, value, said",
    [
        ("--image", "img:1; rm -rf /", "--image='img:1; rm -rf /': an OCI image reference"),
        ("--image", "img:1\n---\nkind: Pod", "an OCI image reference"),
        ("--image", "img 1", "an OCI image reference"),
        ("--image", "Img:1", "an OCI image reference"),
        ("--image", "img:1\u2028x", "an OCI image reference"),
        ("--name", "ok\n---", "--name="),
        ("--namespace", "ns #x", "--namespace="),
        ("--mount-path", "/mnt/$(id)", "--mount-path='/mnt/$(id)': an absolute path of letters"),
        ("--mount-path", "/mnt/a\nb", "an absolute path of letters"),
        ("--mount-path", "/mnt/a,b", "an absolute path of letters"),
        ("--volume", "pvc:a\nb", "--volume="),
    ],
)
@pytest.mark.parametrize("kind", KINDS)
def test_a_kubernetes_flag_its_target_cannot_hold_is_one_line_and_exit_2(capsys, kind, flag, value, said):
    args = [kind, "strategy=multiworker", "cluster=2x1", "--image", "img:1", flag, value]
    code, out, err = export(capsys, *args)
    assert (code, out) == (2, "") and len(err.strip().splitlines()) == 1 and said in err, err


@pytest.mark.parametrize(
    "placed",
    [["cluster=2x1"], ["cluster.workers=1:2", "cluster.launch=agent"]],
    ids=["two tasks of one step", "an agent on every node"],
)
@pytest.mark.parametrize("its_own_run_dir", [True, False], ids=["its run dir", "the job's run dir"])
def test_no_value_rewrites_the_slurm_script_and_the_step_gets_each_intact(
    capsys, tmp_path, nasty_dirs, placed, its_own_run_dir
):
    run_dir = [run_dir_override(tmp_path)] if its_own_run_dir else []
    flag_dir, env_dir = nasty_dirs
    overrides = ["strategy=multiworker", *placed, *run_dir, *OTHERS]
    out = tmp_path / ("script " + NASTY.replace("/", "|"))
    code, printed, err = export(capsys, "slurm", *overrides, "--config-dir", flag_dir, "--out", str(out))
    assert code == 0 and printed == "", err
    text = out.read_text()
    ran = run_script(text, tmp_path)
    assert ran["code"] == 0, ran["stderr"]
    agents = "cluster.launch=agent" in placed
    store = [arg for arg in ran["argv"] if arg.startswith("cluster.agent.store=")]
    token = [arg for arg in ran["argv"] if arg.startswith("cluster.agent.token_file=")]
    assert ran["argv"] == [
        "--config-dir",
        str(Path(flag_dir).resolve()),
        *elastic.expand_shorthand(overrides),
        *(store + token if agents else ["cluster.launch=slurm"]),
        *([] if run_dir else ["hydra.run.dir=outputs/slurm/77"]),
    ]
    assert not agents or re.fullmatch(r"cluster\.agent\.store=node07:\d+", store[0]), store
    if agents:  # the run's secret, made by the script in the run dir the step is given, whatever its name
        secret = tmp_path / "work" / token[0].partition("=")[2]  # an absolute path stays itself
        assert secret.parent.parent.name.startswith("run-x\n---" if run_dir else "77") and secret.is_file(), token
    # the header: one comment line, the command that made it, which a shell reads back word for word
    made_by = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {text.splitlines()[1][2:]}"], capture_output=True, check=True, cwd=tmp_path
    ).stdout
    assert made_by.split(b"\0")[:-1] == [
        word.encode() for word in ["tfdistx", "job", "slurm", *overrides, "--config-dir", flag_dir, "--out", str(out)]
    ]
    assert ran["env"][0] == env_dir  # TFDISTX_CONFIG_PATH, as it was set
    assert ran["pwned"] == [] and ran["scontrol"] == []
    assert "every node must hold each of these directories" in err


@pytest.mark.parametrize(
    "flag, value, said",
    [
        ("--partition", "gpu\n#SBATCH --uid=0", "--partition="),
        ("--partition", "gpu;id", "--partition='gpu;id': a Slurm partition name"),
        ("--time", "04:00:00\n#SBATCH --uid=0", "--time="),
        ("--time", "$(id)", "--time='$(id)': allowed: MM"),
        ("--mem", "64G; id", "--mem='64G; id': Slurm's --mem"),
        ("--mem", "1\n", "--mem="),
        ("--gpus", "2 `id`", "--gpus='2 `id`': a whole number"),
        ("--cpus-per-task", "$(id)", "--cpus-per-task='$(id)': a whole number"),
        ("--nodes", "1\n", "--nodes="),
        ("--notice", "60 #", "--notice='60 #': a whole number"),
    ],
)
def test_a_slurm_flag_sbatch_cannot_hold_is_one_line_and_exit_2(capsys, flag, value, said):
    code, out, err = export(capsys, "slurm", "strategy=multiworker", "cluster=2x1", flag, value)
    assert (code, out) == (2, "") and len(err.strip().splitlines()) == 1 and said in err, err


def test_no_value_rewrites_the_config_recipes_show_prints(capsys):
    """`tfdistx recipes show` prints a composed config to keep as a recipe: its header comment is one line too."""
    override = OTHERS[0]
    with pytest.raises(SystemExit) as leaving:
        cli.main(["recipes", "show", "mnist_mlp", "logger=[default,wandb]", override])
    out = capsys.readouterr().out
    assert leaving.value.code == 0
    [config] = list(yaml.safe_load_all(out))  # one document, whatever the value holds
    assert config["logger"]["wandb"]["project"] == "p " + NASTY
    assert out.splitlines()[0].startswith("# python -m tfdistx recipe=mnist_mlp 'logger=[default,wandb]' $'logger.")
    assert not out.splitlines()[1].startswith("#")

"""The example commands of the README, CONTRIBUTING.md and every page of
docs/, extracted from the pages themselves so that they cannot drift: every
one composes and validates (--plan, fast), and (slow) every training command
runs as written with a small step count, or fails with the message the docs
give for it (offline datasets)."""

import re
import shlex
import sys
from pathlib import Path

import pytest

from conftest import run_command, tfdistx_env
from tfdistx.core.errors import EXIT_NO_NETWORK

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SITE = sorted((ROOT / "docs").glob("*.md"))  # the site's pages (docs/config.md is generated)
# Every page a user reads: the README, CONTRIBUTING.md and the site's.
PAGES = [README, ROOT / "CONTRIBUTING.md", *SITE]
STARTS = ("python -m tfdistx", ".venv/bin/python -m tfdistx", "tfdistx ", "TFDISTX_RECIPES=")
SMALL = [
    "trainer.steps=4",
    "trainer.steps_per_loop=2",
    "trainer.log_every=2",
    "trainer.eval_every=0",
    "trainer.eval_steps=1",
    "checkpoint.every_steps=0",
    "logger.tensorboard=false",
]
# `tfdistx job KIND` prints Kubernetes manifests: the kinds of the documents it prints, in order.
MANIFESTS = {
    ("job", "tfjob"): ["TFJob"],
    ("job", "jobset"): ["JobSet", "NetworkPolicy"],
    ("job", "trainjob"): ["ClusterTrainingRuntime", "TrainJob"],
}
SCRIPT = ("job", "slurm")  # prints a Slurm batch script
OFFLINE = "the download site is unreachable"  # the documented answer for tensorflow-datasets data without network


def commands():
    """("page:line", command) of each example in the pages' code blocks."""
    return [(f"{page.relative_to(ROOT)}:{number}", command) for page in PAGES for number, command in _commands_of(page)]


def _commands_of(page: Path):
    found, pending, start = [], "", 0
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if not line.startswith("    "):
            pending = ""
            continue
        text = line.strip()
        if pending:
            text, start = pending + " " + text, start
        else:
            start = number
        if text.endswith("\\"):
            pending = text[:-1].strip()
            continue
        pending = ""
        text = re.split(r"\s+#\s", text)[0].strip()
        if text.startswith(STARTS) and "pytest" not in text and "&&" not in text:
            found.append((start, text))
    return found


def argv(command: str, home: Path):
    env = {}
    words = shlex.split(command.replace("~", str(home)))
    while "=" in words[0] and not words[0].startswith("-"):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if words[0] == "tfdistx":
        words = [sys.executable, "-m", "tfdistx", *words[1:]]
    elif words[:3] in (["python", "-m", "tfdistx"], [".venv/bin/python", "-m", "tfdistx"]):
        words = [sys.executable, *words[1:]]
    return words, env


# The "Your own project" example (docs/own-project.md), made real in a test's directory:
# its conf/ tree as the page shows it, and a `mypkg` whose functions train.
PROJECT = {
    "mypkg/__init__.py": "",
    "mypkg/models.py": "from tfdistx.models import mlp\n\n\ndef small(input_shape, num_outputs, filters=8):\n"
    "    return mlp(input_shape, num_outputs, hidden_units=(filters,))\n",
    "mypkg/data.py": "from tfdistx.data import synthetic\n\n\ndef digits(num_classes=5):\n"
    "    return synthetic(num_classes=num_classes, train_examples=512, eval_examples=128)\n",
    "conf/model/small.yaml": "_target_: mypkg.models.small\nfilters: 16\n",
    "conf/data/digits.yaml": "_target_: mypkg.data.digits\nbatch_size: 64\n",
    "conf/experiment/mine.yaml": "# @package _global_\n# digits on the small model, 2,000 steps\ndefaults:\n"
    "  - override /model: small\n  - override /data: digits\ntrainer:\n  steps: 2000\n",
}


def own_project(words, root: Path) -> None:
    """A command that names `--config-dir conf` runs in a copy of that project."""
    if "--config-dir" in words:
        for name, text in PROJECT.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)


def run(words, env, cwd, timeout=600):
    """The command as subprocess.run would run it, forked from
    the pytest process's prefork where that is a fresh start."""
    return run_command(words, tfdistx_env(HOME=str(cwd), **env), cwd=cwd, timeout=timeout)


EXAMPLES = commands()


@pytest.mark.parametrize("line, command", EXAMPLES, ids=[where for where, _ in EXAMPLES])
def test_every_readme_command_composes(line, command, tmp_path):
    """Each command's config is valid as written: --plan for runs (no
    TensorFlow), the command itself for the quick subcommands."""
    words, env = argv(command, tmp_path)
    tool = words[3] if len(words) > 3 and words[2] == "tfdistx" else None
    if tool == "data":
        pytest.skip("writes a dataset (data write): tests/test_file_data.py runs it")
    words = _placeholder_files(words, tmp_path)
    own_project(words, tmp_path)
    if tuple(words[3:5]) in MANIFESTS:  # prints manifests: no run needed
        words = words[: words.index(">")] if ">" in words else words
        result = run(words, env, tmp_path, timeout=120)
        assert (
            result.returncode == 0 and re.findall(r"^kind: (\w+)$", result.stdout, re.M) == MANIFESTS[tuple(words[3:5])]
        ), result.stderr
        return
    if tuple(words[3:5]) == SCRIPT:  # prints a batch script: no run needed
        words = words[: words.index(">")] if ">" in words else words
        result = run(words, env, tmp_path, timeout=120)
        assert result.returncode == 0 and result.stdout.startswith("#!/bin/bash\n"), result.stderr
        return
    if tool in ("export", "evaluate", "report", "predict"):
        pytest.skip("needs a run or sweep directory: run by test_every_readme_command_runs (slow)")
    if tool == "recipes":
        if env.get("TFDISTX_RECIPES") or "copy" in words:
            (tmp_path / "my_recipes").mkdir(exist_ok=True)
        result = run(words, env, tmp_path, timeout=120)
        assert result.returncode == 0, result.stderr
        return
    if "-m" in words[3:]:
        pytest.skip("a sweep: composed per job (run by test_every_readme_command_runs, slow)")
    if env.get("TFDISTX_RECIPES"):
        run(
            [sys.executable, "-m", "tfdistx", "recipes", "copy", "mnist_mlp", str(tmp_path / "my_recipes")],
            {},
            tmp_path,
        )
    plan = words if ("--plan" in words or "--cfg" in words) else [*words, "--plan"]
    result = run(plan, env, tmp_path, timeout=120)
    if "mypkg" in command:  # the pages' placeholder package: refused, naming it
        assert result.returncode == 2 and "no module named 'mypkg'" in result.stderr, result.stderr
        return
    assert result.returncode == 0, f"{line}: {command}\n{result.stderr[-2000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("line, command", EXAMPLES, ids=[where for where, _ in EXAMPLES])
def test_every_readme_command_runs(line, command, tmp_path):
    """As written, with a small step count; tensorflow-datasets data without
    network fails with the documented one line instead."""
    words, env = argv(command, tmp_path)
    tool = words[3] if len(words) > 3 and words[2] == "tfdistx" else None
    if (
        "mypkg" in command
        or "--plan" in words
        or "--cfg" in words
        or tool == "recipes"
        or tuple(words[3:5]) in MANIFESTS
        or tuple(words[3:5]) == SCRIPT
    ):
        pytest.skip("checked by test_every_readme_command_composes")
    if "/data/" in command or "'a-*" in command:
        pytest.skip(
            "names a user's own files (/data/...): composed with stand-ins by test_every_readme_command_composes"
        )
    if "cluster.launch=agent" in words:
        pytest.skip(
            "the same command on every node, which names the host that keeps the rounds: test_agents.py runs it "
            "on namespace nodes; composed by test_every_readme_command_composes"
        )
    own_project(words, tmp_path)
    if tool in ("export", "evaluate", "report", "predict"):
        first = run(
            [sys.executable, "-m", "tfdistx", *SMALL, "checkpoint.every_steps=2", f"hydra.run.dir={tmp_path / 'run'}"],
            {},
            tmp_path,
        )
        assert first.returncode == 0, first.stderr
        words = [w if not re.match(r"(outputs|multirun)/", w) else str(tmp_path / "run") for w in words]
        words = [w if w != "500" else "2" for w in words]  # --step 500 -> a step the small run kept
        result = run(words, env, tmp_path)
        assert result.returncode == 0, f"{line}: {command}\n{result.stderr[-2000:]}"
        return
    if env.get("TFDISTX_RECIPES"):
        run(
            [sys.executable, "-m", "tfdistx", "recipes", "copy", "mnist_mlp", str(tmp_path / "my_recipes")],
            {},
            tmp_path,
        )
    if "hydra.sweeper.n_trials=20" in words:
        words = [w.replace("n_trials=20", "n_trials=2") for w in words]
    small = [*SMALL, "data.batch_size=32"]  # after the command's own: the last one given wins
    first_job = [_first_value(w) for w in words if w != "-m" and "interval(" not in w]
    data = run([*first_job, "--cfg", "job", "--package", "data"], env, tmp_path, timeout=120)
    if "download_check_url" in data.stdout:  # tensorflow-datasets data: never reach for the network in a test
        small.append("data.download_check_url=http://127.0.0.1:9")
    result = run([*words, *small], env, tmp_path, timeout=900)
    if (
        result.returncode == EXIT_NO_NETWORK and OFFLINE in result.stdout + result.stderr
    ):  # a local cluster's task says it on stdout, [worker:N]
        return  # documented: offline, tensorflow-datasets data is refused in one line
    assert result.returncode == 0, f"{line}: {command}\n{result.stderr[-3000:]}"


def _placeholder_files(words, root: Path) -> list:
    """The own-data examples (docs/data-in-files.md) name files under /data/: moved under
    `root`, and an empty stand-in made for each pattern (--plan checks that
    a pattern matches, and reads no file)."""
    moved = []
    for word in words:
        word = word.replace("/data/", f"{root}/data/")
        key, _, pattern = word.partition("=")
        if key in ("data.train_files", "data.eval_files"):
            stand_in = Path(pattern.replace("*", "00000"))
            stand_in.parent.mkdir(parents=True, exist_ok=True)
            stand_in.touch()
        moved.append(word)
    return moved


def _first_value(word: str) -> str:
    """`recipe=a,b` (a sweep list) -> `recipe=a`."""
    key, sep, value = word.partition("=")
    return f"{key}={value.split(',')[0]}" if sep and "," in value and "(" not in value and "[" not in value else word

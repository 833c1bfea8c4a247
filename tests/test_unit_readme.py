"""What the README and the docs say, checked in-process (-m unit): they have
example commands (test_readme.py runs them); every test they cite exists (a
file by its name or a pattern, `test_unit_*.py`; a test by its name, the
start of it, `test_a_…`, or a pattern, `test_*_pod_…`, in the file named or
in any); every file of the project they name exists; and the README stays a
page or three, the rest on the site."""

import fnmatch
import re

import pytest

from conftest import TESTS
from test_readme import EXAMPLES, PAGES, README, ROOT, SITE


def page_id(page) -> str:
    return str(page.relative_to(ROOT))


# Where a file the pages name by its path lives: a path that starts with one of these is the project's own.
PROJECT_DIRS = ("tfdistx/", "tests/", "benchmarks/", "conf/", "recipes/", "docs/", "scripts/", ".ci/")


@pytest.mark.unit
def test_the_pages_have_examples():
    assert len(EXAMPLES) > 25, EXAMPLES
    assert {where.partition(":")[0] for where, _ in EXAMPLES} >= {
        "README.md",
        "docs/getting-started.md",
        "docs/multi-process.md",
    }


@pytest.mark.unit
def test_the_readme_fits_on_a_few_screens_and_links_every_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 220
    pages = {page.name for page in SITE if page.name != "index.md"}  # index: the site's home, the README's own words
    assert {name for name in pages if f"(docs/{name}" not in text} == set(), "pages the README does not link"


def defined_tests() -> dict:
    """file name -> the names of the test functions it defines (read, not imported)."""
    return {
        path.name: re.findall(r"^\s*def (test_\w+)", path.read_text(), re.MULTILINE) for path in TESTS.glob("test_*.py")
    }


@pytest.mark.unit
@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_test_a_page_cites_exists(page):
    tests, missing = defined_tests(), []
    for cited in re.findall(r"`(?:tests/)?(test_[^`\s]*)`", page.read_text()):
        file, _, name = (
            cited.rpartition("::") if "::" in cited else ((cited, "", "") if cited.endswith(".py") else ("", "", cited))
        )
        files = fnmatch.filter(tests, file) if file else list(tests)  # a file, or a pattern of them (`test_unit_*.py`)
        if not files or (name and not any(fnmatch.filter(tests[f], name.replace("…", "*")) for f in files)):
            missing.append(cited)
    assert missing == [], f"{page.name} cites tests that are not there: {missing}"


@pytest.mark.unit
@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_file_a_page_names_exists(page):
    """`tfdistx/engine/sharding.py`, `benchmarks/bench_scaling.py`, `conf/task/NAME.yaml`:
    a path of the project in backticks is there (a placeholder in capitals,
    a pattern or a directory of a run excepted)."""
    named = {
        word.rstrip(".,:;")
        for span in re.findall(r"`([^`]+)`", page.read_text())
        for word in span.split()
        if word.startswith(PROJECT_DIRS)
    }
    missing = sorted(
        path
        for path in named
        if not re.search(r"[A-Z]{3,}|[*<{…]", path) and not (ROOT / path.split("::")[0].split("#")[0]).exists()
    )
    assert missing == [], f"{page.name} names files the project does not have: {missing}"


GROUPS = ("checkpoint", "cluster", "data", "logger", "model", "optimizer", "strategy", "task", "trainer")
KEY = re.compile(rf"(?<![\w./+-])((?:{'|'.join(GROUPS)})(?:\.[A-Za-z_]\w*)+)")
# Words that look like keys and are not: Keras' API, a file, Kubeflow Trainer's API group, the placeholder of a logger
# of your own, and the misspelt keys the pages show being refused.
NOT_KEYS = {
    "logger.NAME._target_",
    "model.fit",
    "model.trainable_variables",
    "strategy.py",
    "trainer.kubeflow.org",
    "model.filtrs",
    "model.nonsense",
}


@pytest.mark.unit
@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "config.md"], ids=page_id)
def test_every_key_a_page_names_is_in_the_config_reference(page):
    """`cluster.peer_timeout`, `data.service.workers`: a key a page names, in
    prose or in a command, is a key of the generated reference (or leads to
    one: `data.service`), so a page cannot keep a key the package dropped."""
    reference = set(re.findall(r"^\| `([^`]+)` \|", (ROOT / "docs" / "config.md").read_text(), re.MULTILINE))
    text = page.read_text()
    spans = re.findall(r"`([^`]+)`", text) + [line for line in text.splitlines() if line.startswith("    ")]
    named = {match for span in spans for match in KEY.findall(span)} - NOT_KEYS
    unknown = sorted(
        key
        for key in named
        if not any(known == key or known.startswith(key + ".") or key.startswith(known + ".") for known in reference)
    )
    assert unknown == [], f"{page.name} names keys the config does not have: {unknown}"


def feature_bullets(path) -> list:
    """The page's bold bullets (`- **A local cluster ...** ...`), each with its continuation lines, as one line."""
    bullets, lines = [], path.read_text().splitlines()
    for line in lines:
        if line.startswith("- **"):
            bullets.append(line)
        elif bullets and line.startswith("  ") and not bullets[-1].endswith("\n"):
            bullets[-1] += " " + line.strip()
        elif bullets and not line.strip():
            bullets[-1] += "\n"  # a blank line ends a bullet
    return [bullet.strip() for bullet in bullets]


@pytest.mark.unit
def test_the_sites_home_makes_the_readmes_promises_in_its_words():
    """docs/index.md's list of what tfdistx does is the README's (it said a cluster runs under
    "TF_CONFIG, Slurm or a Kubernetes TFJob" after JobSet and TrainJob came)."""
    index = feature_bullets(ROOT / "docs" / "index.md")
    assert index and index == feature_bullets(README)

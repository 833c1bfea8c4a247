"""What the README says of the tests, checked in-process (-m unit): it has
example commands (test_readme.py runs them), and every test it cites (in
"Faults and bad input that are tested" and elsewhere) exists: a file by its
name or a pattern (`test_unit_*.py`), a test by its name, the start of it
(`test_a_…`) or a pattern (`test_*_pod_…`), in the file named or in any."""

import fnmatch
import re

import pytest

from conftest import TESTS
from test_readme import EXAMPLES, README


@pytest.mark.unit
def test_the_readme_has_examples():
    assert len(EXAMPLES) > 25, EXAMPLES


def defined_tests() -> dict:
    """file name -> the names of the test functions it defines (read, not imported)."""
    return {path.name: re.findall(r"^\s*def (test_\w+)", path.read_text(), re.MULTILINE) for path in TESTS.glob("test_*.py")}


@pytest.mark.unit
def test_every_test_the_readme_cites_exists():
    tests, missing = defined_tests(), []
    for cited in re.findall(r"`(?:tests/)?(test_[^`\s]*)`", README.read_text()):
        file, _, name = cited.rpartition("::") if "::" in cited else ((cited, "", "") if cited.endswith(".py") else ("", "", cited))
        files = fnmatch.filter(tests, file) if file else list(tests)  # a file, or a pattern of them (`test_unit_*.py`)
        if not files or (name and not any(fnmatch.filter(tests[f], name.replace("…", "*")) for f in files)):
            missing.append(cited)
    assert missing == [], f"the README cites tests that are not there: {missing}"

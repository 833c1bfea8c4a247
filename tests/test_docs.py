"""The documentation site builds as mkdocs.yml says, with no broken link or
anchor (`mkdocs build --strict`), and every page of docs/ is in its nav."""

import os
import subprocess
import sys

import yaml

from test_readme import ROOT, SITE


def test_the_site_builds_strict_with_every_page_in_its_nav(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    nav = {page for entry in yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"] for page in entry.values()}
    assert nav == {page.name for page in SITE}
    assert (tmp_path / "site" / "multi-process" / "index.html").is_file()

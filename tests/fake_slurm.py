"""A batch script of `tfdistx job slurm` run as sbatch would run it on
one node, with a fake `srun` and `scontrol` on PATH (no Slurm here; the
real one is tests/test_slurm.py's, -m system): the port probe runs as on a
node, the step's arguments and environment are recorded and its exit code
chosen, `scontrol`'s calls recorded."""

import shlex
import subprocess
import sys
from pathlib import Path

FAKE_SRUN = r"""#!/bin/bash
# The port probe runs as it would on a node; the step's arguments and environment are recorded, its end chosen.
if [[ " $* " == *" tfdistx.launch.slurm.free_ports "* ]]; then
    while [ "$1" != python ]; do shift; done
    exec "$@"
fi
printf '%s\0' "$@" > "$FAKE/step.argv"
printf '%s\0' "${TFDISTX_CONFIG_PATH-unset}" "${TFDISTX_SLURM_PORTS-unset}" "${TFDISTX_GPUS_PER_WORKER-unset}" \
    > "$FAKE/step.env"
if [ -n "${FAKE_SUMMARY:-}" ]; then mkdir -p "$FAKE_SUMMARY" && echo '{}' > "$FAKE_SUMMARY/summary.json.new" \
    && mv "$FAKE_SUMMARY/summary.json.new" "$FAKE_SUMMARY/summary.json"; fi
for ended in ${FAKE_TASKS:-}; do  # RANK:CODE, in the order the step's tasks end: each leaves its code as a task does
    SLURM_PROCID="${ended%%:*}" python -c 'import sys; from tfdistx.commands.ending import leave_exit_code as leave
leave(int(sys.argv[1]))' "${ended##*:}"
done
exit "${FAKE_CODE:-0}"
"""
FAKE_SCONTROL = r"""#!/bin/bash
printf '%s\0' "$@" >> "$FAKE/scontrol.calls"
if [ "$1 $2" = "show hostnames" ]; then echo node07; fi
"""


def fake_slurm(tmp_path) -> Path:
    """A directory for PATH with the fake srun and scontrol, and `python`: this one (tfdistx importable)."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    return bin_dir


def run_script(text: str, tmp_path, code: int = 0, summary_in=None, tasks: str = "") -> dict:
    """The script run as sbatch would on one node (job 77), with the fake Slurm: what it did. `tasks`: the step's
    tasks' ends, "RANK:CODE ..." in order, each code left as a task leaves it (commands/ending.py)."""
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    fake, work, bin_dir = tmp_path / "fake", tmp_path / "work", tmp_path / "fakebin"
    fake.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    if not bin_dir.exists():
        fake_slurm(tmp_path)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FAKE": str(fake),
        "FAKE_CODE": str(code),
        "FAKE_SUMMARY": str(summary_in or ""),
        "FAKE_TASKS": tasks,
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_NODELIST": "node07",
        "SLURMD_NODENAME": "node07",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
    }
    done = subprocess.run(["bash", str(script)], capture_output=True, cwd=work, env=env, timeout=120)
    step = (fake / "step.argv").read_bytes().split(b"\0")[:-1] if (fake / "step.argv").exists() else None
    start = step.index(b"tfdistx") + 1 if step else 0
    calls = (fake / "scontrol.calls").read_bytes().split(b"\0")[:-1] if (fake / "scontrol.calls").exists() else []
    return {
        "code": done.returncode,
        "stderr": done.stderr.decode(errors="replace"),
        "srun": step[:start] if step else None,
        "argv": [word.decode("utf-8", "surrogateescape") for word in step[start:]] if step else None,
        "env": [word.decode() for word in (fake / "step.env").read_bytes().split(b"\0")[:-1]] if step else None,
        "scontrol": [word.decode() for word in calls],
        "pwned": sorted(p.name for p in (*tmp_path.glob("PWNED*"), *work.glob("PWNED*"))),
    }

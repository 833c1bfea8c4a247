"""Checkpoints written in the background, on real processes: a SIGTERM or a
SIGKILL while one is being written, and the multi-process strategies'
resume from one. (In this process: test_unit_async_checkpoints.py.)

A save in flight is seen from outside by its staging directory
(`checkpoints/.writing-ckpt-N/`, engine/checkpoint_writer.py): the signal
is sent as soon as one is there. The model is large enough (a 70 MB
checkpoint) that its write outlasts the few milliseconds between."""

import fcntl
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from conftest import QUICK, run_command, start_tfdistx, tfdistx_env, wait_until, whole_and_resumed
from tfdistx.checkpoint_files import on_disk, step_of

STAGING = ".writing-ckpt-"
# One device, deterministic: a 784-2048-2048-10 MLP with Adam (a 70 MB checkpoint), a save every 5 steps of one call
# each; the steps outrun the writes, so that a save is nearly always in flight.
LARGE = [
    "strategy=one_device",
    "model.hidden_units=[2048,2048]",
    "trainer.steps=100000",
    "trainer.steps_per_loop=1",
    "trainer.log_every=5",
    "trainer.eval_every=0",
    "trainer.deterministic=true",
    "trainer.jit_compile=false",
    "checkpoint.every_steps=5",
    "data.batch_size=32",
    "data.train_examples=512",
    "data.eval_examples=64",
    "logger.tensorboard=false",
    "checkpoint.export=false",
]
TOTAL = 60  # the steps both the interrupted run's resume and the uninterrupted run train to


def in_flight(checkpoints: Path, after_a_whole_one: bool):
    """The step of a save whose files are being written (its staging directory is there, its index not yet), once
    there is one; with `after_a_whole_one`, only once an earlier checkpoint is whole."""
    whole = on_disk(str(checkpoints)) if checkpoints.is_dir() else []
    if after_a_whole_one and not whole:
        return None
    newest = step_of(whole[-1]) if whole else -1
    writing = [
        int(p.name[len(STAGING) :])
        for p in checkpoints.glob(STAGING + "*")
        if int(p.name[len(STAGING) :]) > newest and not (p / f"ckpt-{p.name[len(STAGING) :]}.index").exists()
    ]
    return max(writing) if writing else None


def interrupt_a_save_in_flight(run_dir: Path, send, after_a_whole_one: bool):
    """Start the LARGE run, send it `send` while a save is being written; (exit code, output, step in flight)."""
    checkpoints = run_dir / "checkpoints"
    proc = start_tfdistx(LARGE, run_dir)
    try:
        wait_until(lambda: checkpoints.is_dir(), 300, "the checkpoint directory", [proc])
        deadline, step = time.monotonic() + 300, None
        while step is None:
            assert proc.poll() is None and time.monotonic() < deadline, "no save in flight seen"
            step = in_flight(checkpoints, after_a_whole_one)
            if step is None:
                time.sleep(0.002)  # a tight poll: what is awaited lasts a fraction of a second
        send(proc)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode, out, step


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory) -> str:
    """The final weights of the LARGE run trained to TOTAL steps without a
    stop: trained once a session, by the first test process that asks (the
    SIGTERM and SIGKILL tests run in either); the others wait for it."""
    session = tmp_path_factory.getbasetemp()
    shared = session.parent if os.environ.get("PYTEST_XDIST_WORKER") else session  # xdist's: one per test process
    with open(shared / "async-uninterrupted.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed
        known = shared / "async-uninterrupted.sha256"
        if not known.exists():
            run_dir = tmp_path_factory.mktemp("whole") / "run"
            done = resume_to_total(run_dir, check=False)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            known.write_text(json.loads((run_dir / "summary.json").read_text())["weights_sha256"])
        return known.read_text()


def resume_to_total(run_dir: Path, check: bool = True):
    """The LARGE run trained to TOTAL steps in `run_dir` (resumed from its checkpoint, if any): its summary; with
    `check=False`, the finished command."""
    args = [a for a in LARGE if not a.startswith("trainer.steps=")]
    done = run_command(
        [sys.executable, "-m", "tfdistx", *args, f"trainer.steps={TOTAL}", f"hydra.run.dir={run_dir}"],
        env=tfdistx_env(),
        timeout=900,
    )
    if not check:
        return done
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((run_dir / "summary.json").read_text())


def readable(path: str) -> bool:
    reader = tf.train.load_checkpoint(path)
    return all(reader.get_tensor(name) is not None for name in reader.get_variable_to_shape_map())


def test_sigterm_while_a_save_is_written_exits_42_with_the_signals_checkpoint_whole(tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    code, out, writing = interrupt_a_save_in_flight(
        run_dir, lambda proc: proc.send_signal(signal.SIGTERM), after_a_whole_one=False
    )
    assert code == 42, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    [preempted] = [
        int(line.split("preempted at step ")[1].split(":")[0])
        for line in out.splitlines()
        if "preempted at step " in line
    ]
    assert preempted >= writing < TOTAL
    kept = on_disk(str(run_dir / "checkpoints"))
    # the save in flight finished whole, then the signal's own was written: the newest, named in the state file
    assert step_of(kept[-1]) == preempted and all(readable(path) for path in kept)
    assert writing in [step_of(path) for path in kept] or len(kept) == 3  # written, unless max_to_keep rotated it out
    assert tf.train.latest_checkpoint(str(run_dir / "checkpoints")) == kept[-1]
    assert not list((run_dir / "checkpoints").glob(STAGING + "*"))
    summary = resume_to_total(run_dir)
    assert summary["resumed_from_step"] == preempted
    assert summary["weights_sha256"] == uninterrupted


def test_sigkill_while_a_save_is_written_leaves_the_one_before_newest_and_the_rerun_resumes_bitwise(
    tmp_path, uninterrupted
):
    run_dir, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
    code, out, writing = interrupt_a_save_in_flight(run_dir, lambda proc: proc.kill(), after_a_whole_one=True)
    assert code == -signal.SIGKILL
    kept = on_disk(str(checkpoints))
    assert (checkpoints / f"{STAGING}{writing}").is_dir()  # killed mid-write: its files never moved into place
    assert writing not in [step_of(path) for path in kept]
    newest = step_of(kept[-1])
    assert newest < writing and all(readable(path) for path in kept)
    assert tf.train.latest_checkpoint(str(checkpoints)) == kept[-1]  # the state file names the one before
    summary = resume_to_total(run_dir)
    assert summary["resumed_from_step"] == newest
    assert summary["weights_sha256"] == uninterrupted
    assert not list(checkpoints.glob(STAGING + "*"))  # the rerun removed what the kill left


def test_multiworker_resumes_bitwise_from_a_checkpoint_written_in_the_background(tfdistx, tmp_path):
    args = [*QUICK, "strategy=multiworker", "cluster=2x1", "checkpoint.every_steps=10", "trainer.deterministic=true"]
    whole, resumed = whole_and_resumed(tfdistx, tmp_path, args, stop_at=30, steps=60)
    # the resumed part's saves (40, 50, 60) went on in the background, as the first part's did (10, 20, 30)
    assert resumed.summary["checkpoint"]["background_saves"] == 3
    assert resumed.summary["weights_sha256"] == whole.summary["weights_sha256"]


def digests(arrays) -> list:
    return sorted(hashlib.sha256(str(a.shape).encode() + a.tobytes()).hexdigest() for a in arrays if a.size > 1)


def dumped(path: Path) -> list:
    with np.load(path) as arrays:
        return digests([arrays[name] for name in arrays.files])


def checkpointed(path: Path) -> list:
    reader = tf.train.load_checkpoint(str(path))
    names = reader.get_variable_to_shape_map()
    return digests([reader.get_tensor(name) for name in names if name.startswith("optimizer/")])


def test_parameter_servers_checkpoint_the_boundarys_state_while_the_workers_go_on_and_resume_it_bitwise(
    tfdistx, tmp_path
):
    """Asynchronous workers make no two runs alike: the claim is that the
    checkpoint written in the background holds, bit for bit, the variables
    the ps tasks held at its step (a callback reads them there, before the
    save; the workers' next steps change them while it is written), and
    that a resume starts from exactly them."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    args = [
        *QUICK,
        "strategy=parameter_server",
        "cluster=ps1w2",
        "model.hidden_units=[1024,1024]",
        "trainer.steps_per_loop=2",
        "trainer.log_every=10",
        "checkpoint.every_steps=10",
        "checkpoint.max_to_keep=10",
        "+callbacks.dump._target_=user_plugins.DumpState",
        f"+callbacks.dump.path={dumps}",
        "+callbacks.dump.every=10",
    ]
    first = tfdistx(*args, "trainer.steps=30")
    assert first.returncode == 0, first
    assert first.summary["checkpoint"]["background_saves"] == 3
    for step in (10, 20, 30):
        assert dumped(dumps / f"step-{step}.npz") == checkpointed(first.dir / "checkpoints" / f"ckpt-{step}")
    resumed = tfdistx(*args, "trainer.steps=40")
    assert resumed.returncode == 0 and resumed.summary["resumed_from_step"] == 30, resumed
    assert dumped(dumps / "begin.npz") == checkpointed(first.dir / "checkpoints" / "ckpt-30")

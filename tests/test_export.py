"""A run leaves a servable SavedModel: loaded in a fresh process with plain
TensorFlow and Keras (no tfdistx), it reproduces the run's eval metrics.
Also `tfdistx export RUN_DIR --step N` for any kept checkpoint."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import EXPORTED, QUICK, run_command, tfdistx_env
from tfdistx.data import sources as data_lib

# Runs in a fresh interpreter: plain TensorFlow + Keras, nothing of tfdistx.
REPRODUCE = r"""
import json, sys
import numpy as np, tensorflow as tf, keras
export, arrays, task = sys.argv[1:4]
serve = tf.saved_model.load(export).signatures["serving_default"]
npz = np.load(arrays)
names = serve.structured_input_signature[1]
out = serve(**{name: tf.constant(npz[name]) for name in names})
labels = npz["labels"]
if task == "classification":
    logits = out["logits"].numpy()
    loss = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    result = {"eval/accuracy": float(np.mean(np.argmax(logits, -1) == labels)), "eval/loss": float(np.mean(loss))}
else:
    p = out["probabilities"].numpy()[:, 0]
    pos, neg = p[labels > 0.5], p[labels <= 0.5]  # every positive against every negative, ties half
    auc = (np.sum(pos[:, None] > neg[None, :]) + 0.5 * np.sum(pos[:, None] == neg[None, :])) / (len(pos) * len(neg))
    result = {"eval/auc": float(auc), "eval/accuracy": float(np.mean((p > 0.5) == (labels > 0.5)))}
print(json.dumps({"metrics": result, "tfdistx_loaded": "tfdistx" in sys.modules}))
"""


def reproduce(export_dir, source, task, tmp_path):
    features, labels = next(iter(source.eval(None).batch(1_000_000)))
    arrays = (
        {k: v.numpy() for k, v in features.items()} if isinstance(features, dict) else {"features": features.numpy()}
    )
    np.savez(tmp_path / "eval.npz", labels=labels.numpy(), **arrays)
    env = {k: v for k, v in tfdistx_env().items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", REPRODUCE, str(export_dir), str(tmp_path / "eval.npz"), task],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["tfdistx_loaded"] is False
    return found["metrics"]


def test_multiworker_export_reproduces_the_eval_metrics(tfdistx, tmp_path):
    run = tfdistx(*QUICK, EXPORTED, "strategy=multiworker", "cluster=2x1")
    assert run.returncode == 0, run
    source = data_lib.synthetic(train_examples=512, eval_examples=128)
    found = reproduce(run.dir / "export", source, "classification", tmp_path)
    assert found["eval/accuracy"] == pytest.approx(run.summary["eval"]["eval/accuracy"], abs=1e-6)
    assert found["eval/loss"] == pytest.approx(run.summary["eval"]["eval/loss"], rel=1e-4)


@pytest.mark.parametrize(
    "strategy",
    [
        ["strategy=parameter_server", "cluster=ps1w2"],
        pytest.param(["strategy=multiworker", "cluster=2x1"], marks=pytest.mark.slow),
        pytest.param(["strategy=mirrored", "cluster=1x2"], marks=pytest.mark.slow),
    ],
)
def test_binary_export_reproduces_the_exact_auc(tfdistx, tmp_path, strategy):
    # 300 eval examples: the last batches are uneven across replicas
    run = tfdistx(
        *QUICK,
        EXPORTED,
        *strategy,
        "data=synthetic_categorical",
        "model=wide_deep",
        "data.eval_examples=300",
        "model.vocab_size=1000",
        "data.vocab_size=1000",
        "model.hidden_units=[16]",
    )
    assert run.returncode == 0, run
    source = data_lib.synthetic_categorical(vocab_size=1000, train_examples=512, eval_examples=300)
    found = reproduce(run.dir / "export", source, "binary", tmp_path)
    # exact: the AUC of every example, not of 200 thresholds (which differ by up to auc_error)
    assert found["eval/auc"] == pytest.approx(run.summary["eval"]["eval/auc"], abs=1e-6)
    assert 0 <= run.summary["train"]["auc_error"] < 0.05 and "eval/auc_error" not in run.summary["eval"]
    assert found["eval/accuracy"] == pytest.approx(run.summary["eval"]["eval/accuracy"], abs=1e-6)


@pytest.mark.slow  # tests/test_nothing_lost.py exports a kept checkpoint by default
def test_export_any_kept_checkpoint_afterwards(tfdistx, tmp_path):
    run = tfdistx(*QUICK, "checkpoint.every_steps=20", "checkpoint.export=false")
    assert run.returncode == 0, run
    assert not (run.dir / "export").exists()
    proc = run_command(
        [sys.executable, "-m", "tfdistx", "export", str(run.dir), "--step", "20", "--out", str(tmp_path / "at20")],
        env=tfdistx_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "at20" / "saved_model.pb").exists()
    missing = run_command(
        [sys.executable, "-m", "tfdistx", "export", str(run.dir), "--step", "7"], env=tfdistx_env(), timeout=300
    )
    assert missing.returncode == 2 and "--step=7" in missing.stderr and "Traceback" not in missing.stderr


def test_evaluate_a_kept_checkpoint(tfdistx, tmp_path):
    run = tfdistx(*QUICK, "checkpoint.every_steps=20")
    assert run.returncode == 0, run
    proc = run_command(
        [sys.executable, "-m", "tfdistx", "evaluate", str(run.dir), "--step", "40"], env=tfdistx_env(), timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert record["step"] == 40 and record["checkpoint"] == "ckpt-40"
    assert record["eval/accuracy"] == pytest.approx(run.summary["eval"]["eval/accuracy"], abs=1e-6)
    written = [json.loads(l) for l in (run.dir / "evaluations.jsonl").read_text().splitlines()]
    assert written[-1]["eval/loss"] == pytest.approx(record["eval/loss"])
    # Its lines as the run showed them: the message alone, not Python's or Hydra's formats of the logger's name.
    [compute] = [line for line in run.stdout.splitlines() if line.startswith("compute ")]
    assert compute in proc.stderr.splitlines() and not any(
        line.startswith(("[tfdistx", "INFO:", "WARNING:")) for line in proc.stderr.splitlines()
    ), proc.stderr
    for _ in range(2):  # the second keeps the first aside, and says so as a run would
        exported = run_command(
            [sys.executable, "-m", "tfdistx", "export", str(run.dir)], env=tfdistx_env(), timeout=300
        )
        assert exported.returncode == 0, exported.stderr[-3000:]
    [kept] = run.dir.glob("export.replaced-*")
    assert exported.stderr.splitlines() == [
        f"{run.dir / 'export'} held an earlier one: kept as {kept}",
        f"tfdistx: exported ckpt-40 to {run.dir / 'export'}",
    ], exported.stderr

"""The AUC tfdistx reports: exact over an evaluation (every positive ranked
against every negative), and over training batches within the error it
states beside the value. Checked against brute force on the same scores."""

import numpy as np
import pytest

from tfdistx.engine.metrics import ExactAUC, MetricSet, auc_error_bound, exact_auc

pytestmark = pytest.mark.unit


def brute_force_auc(scores, labels):
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    return (np.sum(pos[:, None] > neg[None, :]) + 0.5 * np.sum(pos[:, None] == neg[None, :])) / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(5))
def test_exact_auc_is_the_pairwise_auc_with_ties(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 500).astype(np.float32)
    scores = np.round(rng.random(500) + labels * 0.3, 2).astype(np.float32)  # rounded: many ties
    assert exact_auc(scores, labels) == pytest.approx(brute_force_auc(scores, labels), abs=1e-12)


def test_scores_crowded_between_two_thresholds_are_ranked_exactly_and_the_training_value_states_its_error():
    # A well-tuned model: every score above 0.999, where 200 thresholds see one bin.
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 2000).astype(np.float32)
    scores = (0.999 + 0.0009 * rng.random(2000) * (0.2 + 0.8 * labels)).astype(np.float32)
    exact = brute_force_auc(scores, labels)
    metrics = MetricSet({"auc": ExactAUC(num_thresholds=200, name="auc")})
    labels_col, scores_col = labels.reshape(-1, 1), scores.reshape(-1, 1)
    metrics.build(labels_col[:2], scores_col[:2])
    totals = metrics.batch_state(labels_col, scores_col, np.zeros(2000, np.float32)).numpy()
    rows = metrics.batch_examples(labels_col, scores_col).numpy()

    assert metrics.results(totals, "eval/", rows)["eval/auc"] == pytest.approx(exact, abs=1e-9)
    thresholded = metrics.results(totals)
    assert abs(thresholded["auc"] - exact) > 0.1  # what 200 thresholds alone would report
    assert abs(thresholded["auc"] - exact) <= thresholded["auc_error"] + 1e-9


def test_the_error_bound_holds_for_spread_scores_too():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 3000).astype(np.float32)
    scores = 1 / (1 + np.exp(-(rng.standard_normal(3000) + 1.5 * labels))).astype(np.float32)
    metric = ExactAUC(num_thresholds=200)
    metric.update_state(labels.reshape(-1, 1), scores.reshape(-1, 1))
    bound = auc_error_bound(metric, [v.numpy() for v in metric.variables])
    assert 0 < bound < 0.01
    assert abs(float(metric.result()) - brute_force_auc(scores, labels)) <= bound

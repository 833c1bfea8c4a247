"""Which way an objective is better: the one rule the sweeper and the report share.

Losses and errors (loss, log_loss, mse, mae, rmse, error rates) are
minimized; everything else a task reports (accuracy, AUC, F1) is maximized.
No TensorFlow here: the sweep is set up before any job starts.
"""

_LOWER_IS_BETTER = ("loss", "error", "perplexity", "mse", "mae", "rmse")


def lower_is_better(metric: str) -> bool:
    name = metric.rpartition("/")[2].lower()
    return any(word in name for word in _LOWER_IS_BETTER)


def direction(metric: str) -> str:
    """Optuna's word for it: 'minimize' or 'maximize'."""
    return "minimize" if lower_is_better(metric) else "maximize"

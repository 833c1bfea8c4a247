"""Which way an objective is better: the one rule the sweeper and the report share.

Also what `trainer.objective` may name, and its value in a run's summary.

Losses and errors (loss, log_loss, mse, mae, rmse, error rates) are
minimized; everything else a task reports (accuracy, AUC, F1) is maximized.
No TensorFlow here: the sweep is set up before any job starts.
"""

from tfdistx.core.errors import Problem

_LOWER_IS_BETTER = ("loss", "error", "perplexity", "mse", "mae", "rmse")


def lower_is_better(metric: str) -> bool:
    name = metric.rpartition("/")[2].lower()
    return any(word in name for word in _LOWER_IS_BETTER)


def direction(metric: str) -> str:
    """Optuna's word for it: 'minimize' or 'maximize'."""
    return "minimize" if lower_is_better(metric) else "maximize"


def objective_problems(objective, task_name: str, metric_names) -> list:
    """`trainer.objective` must be a value the run reports: the loss or a
    metric of the task, evaluated (`eval/...`) or on training batches."""
    names = ["loss", *metric_names]
    allowed = [*(f"eval/{n}" for n in names), *names]
    if objective in allowed:
        return []
    return [Problem("trainer.objective", objective, f"task={task_name} reports {', '.join(allowed)}")]


def unevaluated_problems(objective, keep_best: bool, patience, no_eval: str, fix: str) -> list:
    """checkpoint.keep_best and early stopping by an evaluated objective on
    data with no eval split (`no_eval` says so, `fix` what gives one): the
    value would never be computed, and the run would end with `best: null`."""
    if not str(objective).startswith("eval/"):
        return []
    ending = f"and {no_eval}: {fix}, or a training metric as the objective (e.g. trainer.objective=loss)"
    found = []
    if keep_best:
        found.append(
            Problem(
                "checkpoint.keep_best", True, f"keeps the best checkpoint by trainer.objective={objective}, {ending}"
            )
        )
    if patience is not None:
        found.append(
            Problem(
                "trainer.early_stopping.patience",
                patience,
                f"counts evaluations of trainer.objective={objective}, {ending}",
            )
        )
    return found


def value(name: str, summary: dict) -> float:
    """`eval/accuracy` -> summary['eval']['eval/accuracy']; `loss` -> summary['train']['loss'].
    A run that kept its best checkpoint (checkpoint.keep_best) answers with
    the best value: that is the model it keeps and exports."""
    best = summary.get("best") or {}
    if best.get("checkpoint") and best.get("objective") == name and best.get("value") is not None:
        return float(best["value"])
    for section in ("eval", "train"):
        if name in summary[section]:
            return float(summary[section][name])
    return float("nan")

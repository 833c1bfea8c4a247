"""What the built-in tasks offer, as facts that need no TensorFlow.

Each task module (tfdistx/tasks/) makes the Keras metric for each name; the
names are here so that `task.metrics=[nope]` or `task.top_k=0` is refused
before TensorFlow starts (validate.py). tests/test_tasks.py checks that each
module offers exactly these names.
"""

from omegaconf import DictConfig, OmegaConf

from tfdistx.config.errors import Problem

BINARY = "tfdistx.tasks.binary.Binary"
METRICS = {
    BINARY: ("auc", "accuracy", "log_loss"),
    "tfdistx.tasks.classification.Classification": ("accuracy", "top_k_accuracy"),
    "tfdistx.tasks.multilabel.Multilabel": ("micro_f1", "macro_f1", "auc"),
    "tfdistx.tasks.regression.Regression": ("rmse", "mae", "mse"),
}


def problems(task: DictConfig) -> list:
    """The built-in task's own keys: metrics it offers, and their settings."""
    offered = METRICS.get(str(task.get("_target_")))
    if offered is None:  # a user's task checks its own (Task.choose_metrics)
        return []
    found = []
    metrics = task.get("metrics")
    if metrics is not None and (not _is_list(metrics) or any(m not in offered for m in metrics)):
        found.append(Problem("task.metrics", _plain(metrics), f"task={task.get('name')} offers {', '.join(offered)}"))
    if "top_k" in task and (not _is_int(task.top_k) or task.top_k < 1):
        found.append(Problem("task.top_k", task.top_k, "must be a whole number, at least 1 (and below the number of classes)"))
    for key in ("auc_thresholds",):
        if key in task and (not _is_int(task[key]) or task[key] < 3):
            found.append(Problem(f"task.{key}", task[key], "must be a whole number, at least 3"))
    if "threshold" in task and not (isinstance(task.threshold, (int, float)) and 0 < task.threshold < 1):
        found.append(Problem("task.threshold", task.threshold, "must be a number between 0 and 1"))
    return found


def _is_list(value) -> bool:
    return OmegaConf.is_list(value) or isinstance(value, (list, tuple))


def _plain(value):
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

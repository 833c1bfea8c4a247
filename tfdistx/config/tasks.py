"""What a task's YAML says of it, checked without TensorFlow.

A task module (tfdistx/tasks/) makes the Keras metric for each name; its
YAML (conf/task/NAME.yaml) declares, in keys of tfdistx's own
(schema.TASK_FACTS, not passed to the class):
- `offers`: the metrics `task.metrics` may name (tests/test_tasks.py checks
  that each built-in class offers exactly what its YAML says);
- `labels`: the labels it learns from, when data whose labels are real
  values cannot be among them (binary: 0 and 1).
So `task.metrics=[nope]` or `task.top_k=0` is refused before TensorFlow
starts (validate.py). A task whose YAML declares no `offers` (a user's
`task._target_=mypkg.MyTask`) checks its own keys once built
(Task.choose_metrics).
"""

from omegaconf import DictConfig, OmegaConf

from tfdistx.core.errors import Problem
from tfdistx.core.values import is_whole

# The settings a task's metrics take, checked in any task that declares
# `offers`: the key means the same in every task that has it.
SETTINGS = {
    "top_k": (lambda v: is_whole(v) and v >= 1, "must be a whole number, at least 1 (and below the number of classes)"),
    "auc_thresholds": (lambda v: is_whole(v) and v >= 3, "must be a whole number, at least 3"),
    "threshold": (lambda v: isinstance(v, (int, float)) and 0 < v < 1, "must be a number between 0 and 1"),
}


def problems(task: DictConfig) -> list:
    """The task's own keys: the metrics it offers, and their settings."""
    offered = task.get("offers")
    if offered is None:
        return []
    found = []
    metrics = task.get("metrics")
    if metrics is not None and (not _is_list(metrics) or any(m not in offered for m in metrics)):
        found.append(Problem("task.metrics", _plain(metrics), f"task={task.get('name')} offers {', '.join(offered)}"))
    found += [
        Problem(f"task.{key}", task[key], allowed)
        for key, (ok, allowed) in SETTINGS.items()
        if key in task and not ok(task[key])
    ]
    return found


def real_values_problems(task: DictConfig, labels: str, data_name: str) -> list:
    """A task that declares the labels it learns from, on data whose labels
    are `labels` ("real values"), that it cannot learn from."""
    takes = task.get("labels")
    if not labels or not takes or takes == labels:
        return []
    return [
        Problem(
            "task",
            task.get("name"),
            f"the labels of data={data_name} are {labels}; "
            f"{task.get('name')} takes labels {takes}: use task=regression",
        )
    ]


def _is_list(value) -> bool:
    return OmegaConf.is_list(value) or isinstance(value, (list, tuple))


def _plain(value):
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value

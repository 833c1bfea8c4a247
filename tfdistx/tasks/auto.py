"""task=auto: the task the data's labels call for, known once the data is
read (data=tfds picks it): a class id, classification; multi-hot class
labels, multilabel; real values, regression. Each with its own default
metrics (`task.metrics` names others of the task chosen). The objective is
`eval/loss`, which every task reports, so that a sweep knows its direction
before any data is read; `task=NAME` picks a task, and its objective."""

import logging
from typing import Optional, Sequence

from tfdistx.data.sources import DataSource
from tfdistx.core.errors import ConfigError
from tfdistx.tasks import Task
from tfdistx.tasks.classification import Classification
from tfdistx.tasks.multilabel import Multilabel
from tfdistx.tasks.regression import Regression

log = logging.getLogger(__name__)

BY_LABELS = {DataSource.CLASS: Classification, DataSource.CLASSES: Multilabel, DataSource.VALUES: Regression}


def for_labels(labels: Optional[str] = None, metrics: Optional[Sequence[str]] = None) -> Task:
    """The task for data whose labels are `labels` (what the source says: tfdistx passes it)."""
    chosen = BY_LABELS.get(labels)
    if chosen is None:
        raise ConfigError.for_key(
            "task",
            "auto",
            "the data does not say what its labels are (data=tfds does): pick the task, e.g. task=classification, "
            "task=regression, task=multilabel or task=binary",
        )
    task = chosen() if metrics is None else chosen(metrics=list(metrics))
    return task

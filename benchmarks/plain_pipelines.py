"""The built-in sources handed over as plain pipeline functions, as a user's
own `data._target_` does: a resumed run can only reach its step by reading
and dropping batches (`Dataset.skip`). The "before" of bench_resume.py."""

from tfdistx.data import DataSource
from tfdistx.data import synthetic as _synthetic
from tfdistx.data.files import tfrecord as _tfrecord


def _plain(source: DataSource) -> DataSource:
    return DataSource(
        train=lambda ctx: source.train(ctx),
        eval=(lambda ctx: source.eval(ctx)) if source.eval else None,
        num_classes=source.num_classes,
        train_examples=source.train_examples,
    )


def synthetic(**kwargs) -> DataSource:
    return _plain(_synthetic(**kwargs))


def tfrecord(**kwargs) -> DataSource:
    return _plain(_tfrecord(**kwargs))

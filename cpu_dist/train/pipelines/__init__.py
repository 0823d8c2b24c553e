"""How a worker reads a step's rows and hands off its sparse gradients: one small interface
(:class:`StepPipeline`), several strategies, so the training loop never branches on modes.

Every strategy speaks dicts per table (a step's unique keys, rows and gradients), whether the
job has the one fused table of a job without a job file (``embedding``, in the one-table wire
form, so its bits and speed are unchanged) or a job file's tables; each step's commit covers
all tables, and every table of a step is pulled in one request per shard per
``--ps-max-keys-per-rpc`` keys (``TableReads``).

``DirectPipeline``        waits for the commit its read depends on (t-1, or t-1-K with
                          ``--sparse-sync async``), then pulls every row (``base.py``).
``EarlyPullPipeline``     pipelined commits, ps aggregation: the next step's rows that this
                          step did not write are pulled during the dense phase (``early.py``).
``AsyncPrefetchPipeline`` ``--sparse-sync async`` with K >= 1: the same early pull; the shards'
                          replies say whether they hold every commit the bound needs.
``SoleWriterPipeline``    one worker, ps aggregation, SGD tables: the rows the last two steps
                          wrote are the worker's own (it applies its commits to the rows it
                          read, the shard's arithmetic), the rest pulled during the step
                          before, so reads wait for no commit (``sole_writer.py``).
``CatchUpPipeline``       collective aggregation, pipelined or async: the next step's rows are
                          pulled during the whole step and the worker applies the commits they
                          miss itself (``catch_up.py``), so reads wait for no commit.
``CacheStage``            ``--read-mode bagpipe``: ``gpu_cache``'s bounded row cache of each
                          table in front of the PS, kept coherent with it (``cache.py``).

``choose.py`` is the one place that maps the flags to a strategy (:func:`sparse_mode`), for
the committer and the pipeline alike.  Like TorchRec's train pipelines behind ``progress()``,
each owns the sparse half of a step.
"""

from cpu_dist.train.pipelines.base import DirectPipeline, StepPipeline, TableKeys, TableRows
from cpu_dist.train.pipelines.cache import CacheStage
from cpu_dist.train.pipelines.catch_up import CatchUpPipeline, CatchUpTable
from cpu_dist.train.pipelines.choose import SparseMode, make_committer, make_pipeline, sparse_mode
from cpu_dist.train.pipelines.early import AsyncPrefetchPipeline, EarlyPullPipeline
from cpu_dist.train.pipelines.sole_writer import SoleWriterPipeline

__all__ = [
    "AsyncPrefetchPipeline",
    "CacheStage",
    "CatchUpPipeline",
    "CatchUpTable",
    "DirectPipeline",
    "EarlyPullPipeline",
    "SoleWriterPipeline",
    "SparseMode",
    "StepPipeline",
    "TableKeys",
    "TableRows",
    "make_committer",
    "make_pipeline",
    "sparse_mode",
]

"""The cache stage (``--read-mode bagpipe``) as a step pipeline.

``gpu_cache.CachedRowReader`` serves one table, the default job's fused ``embedding`` (its
``make_reader`` refuses a job file's tables): this is its boundary with the pipelines' dicts
per table, until the stage keeps a cache per table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cpu_dist.train.pipelines.base import TableKeys, TableRows

if TYPE_CHECKING:
    from gpu_cache.controller import CachedRowReader


class CacheStage:
    def __init__(self, reader: CachedRowReader, name: str) -> None:
        self.reader, self.name = reader, name
        self.prefetch_early = reader.prefetch_early

    def read(self, step: int, unique: TableKeys) -> TableRows:
        return {self.name: self.reader.read(step, unique[self.name])}

    def submit(self, step: int, keys: TableKeys, grads: TableKeys) -> None:
        self.reader.submit(step, keys[self.name], grads[self.name])

    def prefetch(self, step: int, unique: TableKeys) -> None:
        self.reader.prefetch(step, unique[self.name])

    def wait_readable(self, step: int) -> None:
        self.reader.wait_readable(step)

    def finish(self, last_step: int) -> None:
        self.reader.finish(last_step)

    def metrics(self) -> dict[str, float]:
        return self.reader.metrics()

"""A local YOLO training's batches read ahead: one thread loads the next batches while the model trains.

UltraFlwr loads in the client's process (``workers=0``): each step waits while its batch's images are read,
mosaicked and augmented, and the device waits with it. Ultralytics draws every augmentation from the
process-wide ``random`` and NumPy streams, sample after sample. One thread that takes the epoch's batches in
the same order, with nothing else drawing from those streams meanwhile, draws exactly what the inline loader
draws: the same samples, so the same run. Only one thread: two would interleave their draws. The reading
stops at the epoch's end (the trainer may change the dataset's transforms between epochs: ``close_mosaic``)
and at ``DEPTH`` batches ahead.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from functools import cache
from typing import Any

#: batches read ahead of the training step at most (memory: one batch of uint8 images each)
DEPTH = 2


class _Reader:
    """Takes ``count`` items from ``source`` in a thread, at most ``depth`` ahead of the consumer."""

    def __init__(self, source: Iterator[Any], count: int, depth: int = DEPTH) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stopped = threading.Event()
        self._count = count
        self._thread = threading.Thread(target=self._read, args=(source,), name="yolo-read-ahead", daemon=True)
        self._thread.start()

    def _put(self, entry: tuple[Any, BaseException | None]) -> bool:
        while not self._stopped.is_set():
            try:
                self._queue.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _read(self, source: Iterator[Any]) -> None:
        try:
            for _ in range(self._count):
                if self._stopped.is_set() or not self._put((next(source), None)):
                    return
        except BaseException as error:  # handed to the training step, which raises it as the inline loader would
            self._put((None, error))

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self._count):
            item, error = self._queue.get()
            if error is not None:
                raise error
            yield item

    def stop(self) -> None:
        """No more reading (the batch being read is finished first, so the loader is left consistent)."""
        self._stopped.set()
        self._thread.join()


@cache
def loader_class() -> type:
    """Ultralytics' ``InfiniteDataLoader`` with each epoch's batches read ahead (imported when first needed)."""
    from ultralytics.data.build import InfiniteDataLoader

    class ReadAheadLoader(InfiniteDataLoader):
        def __iter__(self) -> Iterator[Any]:  # a generator: nothing is read before the trainer takes a batch
            if self.iterator is None:
                self.iterator = self._get_iterator()
            reader = _Reader(self.iterator, len(self))
            self._reader = reader
            try:
                yield from reader
            finally:
                reader.stop()

        def _stop_reading(self) -> None:
            reader = self.__dict__.get("_reader")
            if reader is not None:
                reader.stop()

        def reset(self) -> None:  # the dataset changes (close_mosaic): nothing may be read under the old one
            self._stop_reading()
            super().reset()

        def close(self) -> None:  # a rebuilt loader (Ultralytics' out-of-memory retry) may not share the streams
            self._stop_reading()
            super().close()

    return ReadAheadLoader


def read_ahead(loader: Any, multi_scale: float = 0.0) -> bool:
    """Make ``loader`` (Ultralytics' training loader) read its batches ahead where that leaves the samples as
    they are: loading in this process (a worker process has its own streams) and no multi-scale training
    (the trainer draws each step's size from ``random`` in this thread). Whether it does."""
    base = loader_class().__mro__[1]
    if type(loader) is not base or loader.num_workers != 0 or multi_scale:
        return False
    loader.__class__ = loader_class()
    return True

"""The input of a watched run: the datasets the checked strategy distributes are marked, so that each
element drawn eagerly from them is a step boundary (or, where the script distributes none, its own
datasets'); its unseeded shuffles and its shards are recorded."""

from __future__ import annotations

import sys
import zlib

import tensorflow as tf


class DatasetsWatch:
    """The watcher's part that marks the script's datasets and iterators."""

    def _shuffle(self, original):
        """``Dataset.shuffle`` for the run: a shuffle the script's code asks for without a seed is kept."""
        watcher = self

        def shuffle(self_, buffer_size, seed=None, *args, **kwargs):
            users = seed is None and watcher._called_by_user(sys._getframe(1))
            if users and watcher.coordinated:
                # each parameter-server worker would draw an order of its own: both runs get one seed per line
                where = watcher._where(sys._getframe(1))
                seed = watcher.seeded_shuffles.setdefault(where, zlib.crc32(where.encode()) % 2**31)
                return original(self_, buffer_size, seed, *args, **kwargs)
            if users and watcher.worker:  # another process draws another order (a seed of this worker's own)
                seed = 7919 * watcher.worker + len(watcher._unseeded)
            out = original(self_, buffer_size, seed, *args, **kwargs)
            if users:
                watcher._unseeded[id(out)] = (out, watcher._where(sys._getframe(1)))
            return out
        return shuffle

    def _upstream_unseeded(self, dataset) -> str | None:
        """Where an unseeded shuffle upstream of ``dataset`` was made (following ``_input_dataset``)."""
        for _ in range(64):
            if dataset is None:
                return None
            if id(dataset) in self._unseeded and self._unseeded[id(dataset)][0] is dataset:
                return self._unseeded[id(dataset)][1]
            dataset = getattr(dataset, "_input_dataset", None)
        return None

    def _shard(self, original):
        """``Dataset.shard`` for the run: a shard of a dataset shuffled without a seed is kept."""
        watcher = self

        def shard(self_, *args, **kwargs):
            shuffled = watcher._upstream_unseeded(self_)
            if shuffled is not None:
                watcher.shuffled_before_sharding.setdefault(shuffled, f"shard at {watcher._where(sys._getframe(1))}")
            return original(self_, *args, **kwargs)
        return shard

    def _distribute(self, real_distribute):
        def distribute(*args, **kwargs):
            if args and isinstance(args[0], tf.data.Dataset):  # auto-sharded per worker after the whole pipeline
                shuffled = self._upstream_unseeded(args[0])
                if shuffled is not None:
                    self.shuffled_before_sharding.setdefault(shuffled, "auto-sharded by experimental_distribute_dataset")
            out = real_distribute(*args, **kwargs)
            self.distributed = True
            self._mark(out)
            return out
        return distribute

    def _mark(self, obj) -> None:
        self._marked[id(obj)] = obj
        cls = type(obj)
        if ("iter", cls) in self._wrapped_types:
            return
        self._wrapped_types.add(("iter", cls))
        original = cls.__iter__
        watcher = self

        def __iter__(self_):
            it = original(self_)
            if id(self_) in watcher._marked and tf.executing_eagerly():
                watcher._mark_iterator(it)
            return it

        self._patch(cls, "__iter__", __iter__)

    def _plain_iter(self, original):
        """``tf.data.Dataset.__iter__`` for the run: an iterator the script makes eagerly of a dataset
        it did not distribute is kept, so that where it distributes none, its draws are the boundaries."""
        watcher = self

        def __iter__(self_):
            it = original(self_)
            if tf.executing_eagerly() and id(self_) not in watcher._marked and watcher._called_by_user(sys._getframe(1)):
                watcher._mark_iterator(it, plain=True)
            return it
        return __iter__

    def _mark_iterator(self, it, plain: bool = False) -> None:
        (self._plain if plain else self._marked)[id(it)] = it
        cls = type(it)
        if ("next", cls) in self._wrapped_types:
            return
        self._wrapped_types.add(("next", cls))
        watcher = self
        for name in ("__next__", "get_next", "get_next_as_optional"):
            original = getattr(cls, name, None)
            if original is None:
                continue

            def drawing(self_, *args, _original=original, **kwargs):
                if not watcher._counts(self_) or getattr(watcher._local, "drawing", False) \
                        or not tf.executing_eagerly() or watcher.mode in ("calls", "schedules", "fit"):
                    return _original(self_, *args, **kwargs)
                watcher.mode = "draws"
                watcher.boundary()
                watcher._local.drawing = True
                try:
                    element = _original(self_, *args, **kwargs)
                finally:
                    watcher._local.drawing = False
                watcher.drew(element)
                return element

            self._patch(cls, name, drawing)

    def _counts(self, iterator) -> bool:
        """Whether a draw from ``iterator`` is a step boundary: it is a distributed dataset's, or the
        script distributes none and this is one of its own datasets', drawn once variables exist."""
        if id(iterator) in self._marked:
            return True
        return id(iterator) in self._plain and bool(self.variables) and not self._marked

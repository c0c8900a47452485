"""The variables of a watched run: a creator scope around the run and one inside the checked strategy's
``scope()`` record every variable in creation order (a distributed variable whole); one made after the
first boundary is recorded with its value at creation (the reference's start from the spec's run's); in the
reference, a creator in its scope makes the ``ShardedVariable``s the script's ``variable_partitioner`` asks."""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import tensorflow as tf


class VariablesWatch:
    """The watcher's part that records the variables the script creates."""

    def _add(self, v, late=None) -> None:
        if id(v) not in self._ids:
            self._ids.add(id(v))
            self.variables.append(v)
            if late is not None:  # made in the first step (a model built by its first call), from this value
                self.created_late[id(v)] = late[2]
                self.late_values.append(late)

    def _late(self, kwargs: dict):
        """A variable made after the first boundary (a model built by its first call in the step, in a
        trace, where its value cannot be read at its creation): its initial value computed here, at
        once, or the reference's of the first one made under the same name with the same shape
        (``late_init``), where one is left, so that both sides start it from the same value. The
        kwargs to make it with, and its [name, shape, value] (None: not one made late)."""
        if not self.boundaries or getattr(self._local, "inner", 0) or kwargs.get("initial_value") is None:
            return kwargs, None
        initial = kwargs["initial_value"]
        try:
            with tf.init_scope():
                value = np.array(tf.convert_to_tensor(initial() if callable(initial) else initial,
                                                      dtype=kwargs.get("dtype")))
        except Exception:  # noqa: BLE001  (a value only its trace can make, a checkpoint's: made as asked)
            return kwargs, None
        name = str(kwargs.get("name"))
        for entry in self.late_init:
            if entry[0] == name and list(entry[1]) == list(value.shape):
                self.late_init.remove(entry)
                value = np.asarray(entry[2])
                break
        return {**kwargs, "initial_value": value}, [name, list(value.shape), value]

    def _outer(self, next_creator, **kwargs):
        kwargs, late = self._late(kwargs)
        v = next_creator(**kwargs)
        if not getattr(self._local, "inner", 0):  # not a part of a distributed variable being made
            self._add(v, late)
        return v

    def _inner(self, next_creator, **kwargs):
        kwargs, late = self._late(kwargs)
        self._local.inner = getattr(self._local, "inner", 0) + 1
        try:
            v = next_creator(**kwargs)
        finally:
            self._local.inner -= 1
        if not self._local.inner:
            self._add(v, late)
        return v

    def _scope(self, real_scope):
        @contextlib.contextmanager
        def scope():
            with real_scope(), tf.variable_creator_scope(self._sharding), tf.variable_creator_scope(self._inner):
                yield
        return scope

    def _sharding(self, next_creator, **kwargs):
        """In the reference of a script whose ParameterServerStrategy has a ``variable_partitioner``,
        a variable made in its scope is sharded as that strategy shards it (a ``ShardedVariable`` of
        "div" parts, ``ParameterServerStrategyV2Extended._create_variable``), so that both sides hold
        the same variables; elsewhere, made as asked."""
        partitioner, initial_value = self.partitioner, kwargs.get("initial_value")
        if (partitioner is None or self._coordinator_args[0] is not None or "colocate_with" in kwargs
                or initial_value is None):
            return next_creator(**kwargs)
        from tensorflow.python.distribute import sharded_variable  # private: the class TensorFlow shards into

        shape, dtype = kwargs.get("shape"), kwargs.get("dtype")
        from_fn = callable(initial_value) and shape is not None and dtype is not None
        if not from_fn:
            initial_value = tf.convert_to_tensor(initial_value() if callable(initial_value) else initial_value,
                                                 dtype=dtype)
            shape, dtype = initial_value.shape, initial_value.dtype
            kwargs["initial_value"] = initial_value
        shape = tf.TensorShape(shape)
        parts = partitioner(shape=shape, dtype=tf.as_dtype(dtype)) if shape.rank else None
        if not parts or parts[0] <= 1:
            return next_creator(**kwargs)
        n = min(parts[0], shape[0])
        offsets = [0]
        for i in range(n):
            offsets.append(offsets[-1] + shape[0] // n + (1 if i < shape[0] % n else 0))

        def shard(i):
            if not from_fn:
                return initial_value[offsets[i]:offsets[i + 1]]
            part = (offsets[i + 1] - offsets[i], *shape[1:])
            try:
                value = initial_value(partition_shape=part, partition_offset=(offsets[i],) + (0,) * (shape.rank - 1))
            except (TypeError, ValueError):  # an initializer that takes no partition: the whole value, sliced
                value = initial_value()
            return value if tuple(value.shape) == part else value[offsets[i]:offsets[i + 1]]

        name, shards = kwargs.get("name"), []
        for i in range(n):
            kwargs["shape"] = (offsets[i + 1] - offsets[i], *shape[1:])
            kwargs["initial_value"] = functools.partial(shard, i)
            if name is not None:
                kwargs["name"] = f"{name}/part_{i}"
            shards.append(next_creator(**kwargs))
        return sharded_variable.ShardedVariable(shards)

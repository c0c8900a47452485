"""reference/clipping.py against the documentation: the tf.clip_by_* docstrings' worked examples
and the properties they state, and the rule that a strategy clips the summed gradient once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from reference import clipping

# dyadic values in [-4, 4] (no subnormals: their products lose the relative precision compared)
finite = st.integers(-2 ** 20, 2 ** 20).map(lambda k: k / 2 ** 18)
tensors = hnp.array_shapes(min_dims=1, max_dims=2, max_side=3).flatmap(lambda s: hnp.arrays(np.float64, s, elements=finite))


def test_clip_by_norm_reproduces_its_docstring_example():
    # tf.clip_by_norm: "some_nums = [[1, 2, 3, 4, 5]]; tf.clip_by_norm(some_nums, 2.0)" prints (float32)
    documented = [[0.26967996, 0.5393599, 0.80903983, 1.0787199, 1.3483998]]
    np.testing.assert_allclose(clipping.clip_by_norm([[1, 2, 3, 4, 5]], 2.0), documented, rtol=2 ** -23)


def test_clip_by_value_reproduces_its_docstring_example():
    # tf.clip_by_value: t = [[-10., -1., 0.], [0., 2., 10.]] clipped to [-1, 1]
    np.testing.assert_array_equal(clipping.clip_by_value([[-10.0, -1.0, 0.0], [0.0, 2.0, 10.0]], 1.0),
                                  [[-1.0, -1.0, 0.0], [0.0, 1.0, 1.0]])


@given(st.lists(tensors, min_size=1, max_size=3), st.floats(1 / 16, 8))
def test_clip_by_global_norm_keeps_or_shrinks_by_the_global_ratio(ts, c):
    """The docstring: "If clip_norm > global_norm then the entries remain as they are, otherwise
    they're all shrunk by the global ratio"; the result's global norm is at most clip_norm."""
    out = clipping.clip_by_global_norm(ts, c)
    norm = clipping.global_norm(ts)
    ratio = 1.0 if c > norm else c / norm
    for t, o in zip(ts, out):
        np.testing.assert_allclose(o, np.asarray(t) * ratio, rtol=1e-15, atol=0)
    assert clipping.global_norm(out) <= c * (1 + 1e-12)


def test_an_infinite_global_norm_sets_every_entry_to_nan():
    out = clipping.clip_by_global_norm([[1.0, np.inf], [2.0]], 1.0)
    assert all(np.isnan(o).all() for o in out)


@given(tensors, st.floats(1 / 16, 8))
def test_clip_by_norm_bounds_the_norm_and_keeps_the_direction(t, c):
    out = clipping.clip_by_norm(t, c)
    assert np.sqrt(np.sum(out ** 2)) <= c * (1 + 1e-12)
    np.testing.assert_allclose(out, t * min(1.0, c / max(np.sqrt(np.sum(t ** 2)), 1e-300)), rtol=1e-15)


def test_clipping_the_sum_differs_from_summing_the_clipped_gradients():
    """The case a property must draw: each replica's gradient under the threshold, their sum over
    it (and the reverse), so clipping before the all-reduce gives another update."""
    g = [[np.array([0.75, 0.0])], [np.array([0.75, 0.0])]]  # norms 0.75 each, 1.5 summed
    once = clipping.distributed_clipped_gradients(g, "clipnorm", 1.0)
    per_replica = [sum(clipping.clip_gradients(r, "clipnorm", 1.0)[0] for r in g)]
    np.testing.assert_allclose(once[0], [1.0, 0.0])
    np.testing.assert_allclose(per_replica[0], [1.5, 0.0])
    g = [[np.array([2.0, 0.0])], [np.array([-2.0, 0.0])]]  # norms 2 each, 0 summed
    np.testing.assert_allclose(clipping.distributed_clipped_gradients(g, "global_clipnorm", 1.0)[0], [0.0, 0.0])


def test_an_unknown_option_is_an_error():
    with pytest.raises(ValueError, match="option must be one of"):
        clipping.clip_gradients([np.ones(2)], "clip_everything", 1.0)

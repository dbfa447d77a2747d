"""The one error measure: max |got - ref| / max |ref| over the reference's finite values."""

from __future__ import annotations

import numpy as np

from amp_compiler.metrics import error_stats, max_rel_error, rel_error


def test_relative_to_the_largest_reference_magnitude_not_per_element():
    ref = np.array([100.0, 1e-6, -50.0], np.float32)
    got = ref + np.array([1.0, 1e-3, 0.0], np.float32)  # huge error on the tiny value, per element
    max_abs, rel = error_stats(ref, got)
    assert (max_abs, rel) == (1.0, 0.01)


def test_shape_or_non_finite_mismatch_is_an_infinite_error():
    ref = np.ones((2, 3), np.float32)
    assert rel_error(ref, np.ones((3, 2), np.float32)) == float("inf")
    assert rel_error(ref, np.where(np.eye(2, 3) > 0, np.inf, 1.0)) == float("inf")
    assert rel_error(np.array([np.inf, 1.0]), np.array([np.inf, 1.5])) == 0.5  # same inf: compared elsewhere


def test_all_zero_reference_falls_back_to_the_absolute_error_and_worst_output_wins():
    assert rel_error(np.zeros(4), np.full(4, 0.25)) == 0.25
    assert max_rel_error([np.ones(2), np.ones(2)], [np.ones(2), np.array([1.0, 1.5])]) == 0.5
    assert max_rel_error([], []) == 0.0

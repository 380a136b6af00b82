"""Objective and likelihood functions that SciPy and emcee run in pool workers
(tests/integration/test_scientific_maps.py): module level, so workers import them by name."""

from __future__ import annotations

from typing import Any

import numpy as np


def rosen(x: Any) -> float:
    """The Rosenbrock function, with an ill-conditioned valley: the optimisers' usual test."""
    x = np.asarray(x)
    return float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2))


def bumps(x: Any, scale: float = 1.0) -> float:
    """Several local minima, for brute force on a grid."""
    x = np.asarray(x)
    return float(scale * np.sum(np.sin(3 * x) + 0.1 * x**2))


def vector_integrand(t: float) -> Any:
    """A vector-valued integrand for quad_vec: t**k for k = 0..4."""
    return t ** np.arange(5)


def log_prob_gauss(theta: Any, ivar: Any) -> float:
    """log-density of an axis-aligned Gaussian with inverse variances ivar."""
    return float(-0.5 * np.sum(ivar * np.asarray(theta) ** 2))


def fails_below_zero(x: Any) -> float:
    if x[0] < 0:
        raise ValueError(f"negative input {x[0]}")
    return float(x[0])

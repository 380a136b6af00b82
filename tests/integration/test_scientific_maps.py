"""The map protocol scientific libraries accept (issue 17, section 3; docs/scipy.md).

SciPy's ``workers=`` takes a map-like callable, ``workers=pool.map``; emcee's ``pool=``
takes an object with a ``map`` method, the pool itself.  Each run here gives exactly the
answer of the same call without a pool: same seeds, same evaluations, only where they
run differs.  ``fastpool.Pool.map`` returns a lazy iterator; each library wraps it in
``list()`` (checked here by running them), and ``fastpool.mp.Pool.map`` returns a list.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import _tasks
import numpy as np
import pytest

import fastpool
import fastpool.mp

scipy_optimize = pytest.importorskip("scipy.optimize", reason="scipy is in the test extra")
scipy_integrate = pytest.importorskip("scipy.integrate", reason="scipy is in the test extra")


@pytest.fixture(params=["fastpool.Pool", "fastpool.mp.Pool"])
def any_pool(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Either pool, shut down after the test."""
    if request.param == "fastpool.Pool":
        with fastpool.Pool(2) as p:
            yield p
    else:
        p = fastpool.mp.Pool(2)
        try:
            yield p
        finally:
            p.close()
            p.join()


def test_differential_evolution_with_workers_pool_map_matches_workers_1(any_pool: Any) -> None:
    kwargs: dict[str, Any] = {
        "bounds": [(-2, 2)] * 3,
        "seed": 7,
        "maxiter": 40,
        "tol": 0,
        "polish": False,
        "updating": "deferred",
    }
    serial = scipy_optimize.differential_evolution(_tasks.rosen, workers=1, **kwargs)
    pooled = scipy_optimize.differential_evolution(_tasks.rosen, workers=any_pool.map, **kwargs)
    assert np.array_equal(pooled.x, serial.x)
    assert pooled.fun == serial.fun and pooled.nfev == serial.nfev


def test_brute_with_workers_pool_map_matches_workers_1(any_pool: Any) -> None:
    ranges = (slice(-2, 2, 0.25), slice(-2, 2, 0.25))
    serial = scipy_optimize.brute(
        _tasks.bumps, ranges, args=(2.0,), full_output=True, finish=None, workers=1
    )
    pooled = scipy_optimize.brute(
        _tasks.bumps, ranges, args=(2.0,), full_output=True, finish=None, workers=any_pool.map
    )
    assert np.array_equal(pooled[0], serial[0]) and pooled[1] == serial[1]
    assert np.array_equal(pooled[3], serial[3])  # every grid value, in place


def test_quad_vec_with_workers_pool_map_matches_workers_1(any_pool: Any) -> None:
    serial, err1 = scipy_integrate.quad_vec(_tasks.vector_integrand, 0, 2, workers=1)
    pooled, err2 = scipy_integrate.quad_vec(_tasks.vector_integrand, 0, 2, workers=any_pool.map)
    assert np.array_equal(pooled, serial) and err1 == err2
    assert np.allclose(pooled, 2.0 ** np.arange(1, 6) / np.arange(1, 6))


def test_emcee_accepts_the_pool_itself_and_samples_the_same_chain(any_pool: Any) -> None:
    emcee = pytest.importorskip("emcee", reason="emcee is in the test extra")
    nwalkers, ndim = 16, 3
    ivar = 1.0 / np.arange(1, ndim + 1)
    p0 = np.random.default_rng(3).normal(size=(nwalkers, ndim))

    def run(pool: Any) -> Any:
        sampler = emcee.EnsembleSampler(
            nwalkers, ndim, _tasks.log_prob_gauss, args=[ivar], pool=pool
        )
        sampler.random_state = np.random.RandomState(11).get_state()
        sampler.run_mcmc(p0, 30, progress=False)
        return sampler.get_chain(), sampler.get_log_prob()

    chain, logp = run(any_pool)
    serial_chain, serial_logp = run(None)
    assert np.array_equal(chain, serial_chain) and np.array_equal(logp, serial_logp)


def test_a_failing_objective_raises_its_own_exception_through_scipy(any_pool: Any) -> None:
    with pytest.raises(ValueError, match="negative"):
        scipy_optimize.brute(
            _tasks.fails_below_zero, (slice(-1, 1, 0.5),), finish=None, workers=any_pool.map
        )

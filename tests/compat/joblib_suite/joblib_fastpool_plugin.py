"""A pytest plugin (``-p joblib_fastpool_plugin``) that runs joblib's own tests with a
``"fastpool"`` case wherever a test is parametrized over ``"loky"`` as a backend.

joblib's files stay unchanged: importing ``fastpool.joblib`` here, before pytest imports
the test modules, puts ``"fastpool"`` in ``joblib.parallel.BACKENDS`` (so the tests built
from it, such as ``ALL_VALID_BACKENDS``, list it as joblib lists every registered backend);
``pytest_generate_tests`` adds a copy of each parametrize row whose backend column holds
``"loky"``, with ``"fastpool"`` in its place, before pytest's own hook parametrizes.
Each case's kind in the report (suite_report, loaded beside it) is the backend it names.
"""

from __future__ import annotations

from typing import Any

import pytest
import suite_report
from _pytest.mark.structures import ParameterSet

import fastpool.joblib  # registers the backend before the test modules are imported


def _swap(value: Any) -> Any:
    return "fastpool" if value == "loky" and isinstance(value, str) else value


def _with_fastpool(argnames: Any, argvalues: Any, ids: Any) -> tuple[list, Any] | None:
    """The parametrize values with a fastpool row after each loky row of a backend
    column, and the ids to match; None when no backend column lists loky."""
    names = [n.strip() for n in argnames.split(",")] if isinstance(argnames, str) else argnames
    columns = [i for i, n in enumerate(names) if "backend" in n]
    if not columns or isinstance(argvalues, dict) or "fastpool" in list(argvalues):
        return None  # a dict is BACKENDS itself, which already holds fastpool
    values, new_ids, changed = [], None if not isinstance(ids, list) else [], False
    for i, row in enumerate(argvalues):
        values.append(row)
        if new_ids is not None:
            new_ids.append(ids[i])
        marks: Any = ()
        if isinstance(row, ParameterSet):
            row, marks = row.values, row.marks
        elif len(names) == 1:
            row = (row,)
        if not any(row[c] == "loky" for c in columns if isinstance(row[c], str)):
            continue
        swapped = tuple(_swap(v) if c in columns else v for c, v in enumerate(row))
        changed = True
        values.append(pytest.param(*swapped, marks=marks))
        if new_ids is not None:
            new_ids.append(str(ids[i]).replace("loky", "fastpool"))
    return (values, new_ids if new_ids is not None else ids) if changed else None


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    markers = metafunc.definition.own_markers
    for k, mark in enumerate(markers):
        if mark.name != "parametrize":
            continue
        argnames, argvalues = mark.args[:2]
        ids = mark.kwargs.get("ids")
        added = _with_fastpool(argnames, argvalues, ids)
        if added is not None:
            kwargs = dict(mark.kwargs)
            if ids is not None:
                kwargs["ids"] = added[1]
            markers[k] = pytest.mark.parametrize(argnames, added[0], **kwargs).mark


def _kind(item: pytest.Item) -> str:
    params = getattr(getattr(item, "callspec", None), "params", {})
    from joblib._parallel_backends import LokyBackend

    for v in params.values():
        if (isinstance(v, str) and v == "fastpool") or isinstance(
            v, fastpool.joblib.FastpoolBackend
        ):
            return "fastpool"
    for v in params.values():
        if (isinstance(v, str) and v == "loky") or type(v) is LokyBackend:
            return "loky"
    return "other"


suite_report.kind_of = _kind

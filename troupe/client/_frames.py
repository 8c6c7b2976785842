"""Tables for a notebook: pandas DataFrames, built only when pandas is there (the
``troupe[pandas]`` extra); without it, an ImportError that says which extra to install."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError("tables need pandas: pip install 'troupe[pandas]' (or pip install pandas)") from None
    return pandas


def runs_frame(rows: Iterable[Mapping[str, Any]]) -> Any:
    """One row per run: its fields, each scalar param as a ``node.param`` column, each
    param its script logged as ``params.NAME`` and each series' newest value as
    ``metric.SERIES`` (as ``mlflow.search_runs`` lays them out)."""
    pandas = _pandas()
    table = []
    for row in rows:
        flat = {key: value for key, value in row.items() if key not in ("params", "metrics", "progress",
                                                                         "queue_reason", "tags", "logged_params")}
        flat["tags"] = ",".join(row.get("tags") or ())
        flat.update({str(key): value for key, value in (row.get("params") or {}).items()})
        flat.update({f"params.{key}": value for key, value in (row.get("logged_params") or {}).items()})
        flat.update({f"metric.{key}": value for key, value in (row.get("metrics") or {}).items()})
        table.append(flat)
    return pandas.DataFrame(table)


def groups_frame(groups: Iterable[Mapping[str, Any]], group_by: str, metric: str | None) -> Any:
    """One row per value of ``group_by``: the value (a column named as the key), its
    ``label`` (a submitter's, a sweep's or a study's name) where there is one, ``runs``,
    and with ``metric`` that series' ``metric.SERIES.runs/mean/min/max/std``."""
    pandas = _pandas()
    columns = [group_by, "runs"]
    if metric:
        columns += [f"metric.{metric}.{stat}" for stat in ("runs", "mean", "min", "max", "std")]
    table = []
    for group in groups:
        row: dict[str, Any] = {group_by: group["value"], "runs": group["runs"]}
        if group.get("label") is not None:
            row["label"] = group["label"]
        stats = group.get("metric") or {}
        if metric:
            row.update({f"metric.{metric}.{stat}": stats.get(stat) for stat in ("runs", "mean", "min", "max", "std")})
        table.append(row)
    if any("label" in row for row in table):
        columns.insert(1, "label")
    return pandas.DataFrame(table, columns=columns)


def metrics_frame(series: Mapping[str, Iterable[Any]]) -> Any:
    """The points of every series in long form: series, step, value, ts."""
    pandas = _pandas()
    return pandas.DataFrame([{"series": name, "step": p.step, "value": p.value, "ts": p.ts}
                             for name, points in series.items() for p in points],
                            columns=["series", "step", "value", "ts"])

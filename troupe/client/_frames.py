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
    """One row per run: its fields, each scalar param as a ``node.param`` column and each
    series' newest value as ``metric.SERIES`` (as ``mlflow.search_runs`` lays them out)."""
    pandas = _pandas()
    table = []
    for row in rows:
        flat = {key: value for key, value in row.items() if key not in ("params", "metrics", "progress",
                                                                         "queue_reason", "tags")}
        flat["tags"] = ",".join(row.get("tags") or ())
        flat.update({str(key): value for key, value in (row.get("params") or {}).items()})
        flat.update({f"metric.{key}": value for key, value in (row.get("metrics") or {}).items()})
        table.append(flat)
    return pandas.DataFrame(table)


def metrics_frame(series: Mapping[str, Iterable[Any]]) -> Any:
    """The points of every series in long form: series, step, value, ts."""
    pandas = _pandas()
    return pandas.DataFrame([{"series": name, "step": p.step, "value": p.value, "ts": p.ts}
                             for name, points in series.items() for p in points],
                            columns=["series", "step", "value", "ts"])

"""Which split a row is in, as preparation decides it: for a central baseline scored on the same test rows.

Preparation (:func:`insitu.data.prepare.prepare_shard`) assigns each row it keeps to train, val or test by
a keyed hash of the row's id (:func:`insitu.data.features.assign_split`), keyed by the dataset's
``split_key`` with the training's ``split`` fractions. :func:`split_of` is that assignment, and preparation
calls it, so the two cannot disagree. :func:`split_rows` adds what preparation does before it: the schema's
validation, which drops quarantined rows and gives the id column its canonical type. See docs/baselines.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from insitu.conf import SchemaConfig, SplitConfig
from insitu.data.features import assign_split
from insitu.data.schema import validate


def split_of(ids: Iterable[object], *, split_key: int, split: SplitConfig | Mapping[str, float]) -> np.ndarray:
    """``"train"``, ``"val"`` or ``"test"`` for each row id, exactly as preparation assigns it.

    ``split_key`` is the dataset's (``conf.dataset.split_key``, ``split_key:`` in conf/datasets.yaml, 0 by
    default); ``split`` the training's fractions (``conf.training.split``, or a mapping such as
    ``{"train": 0.7, "val": 0.15, "test": 0.15}``). An id's split depends on nothing else: not on the
    row's shard, its position or the other rows. Ids are compared as text (``str(id)``), as preparation
    sees them after validation: pass them as the file reads with pandas' defaults, or use
    :func:`split_rows`, which validates first. Returns an array of the same length as ``ids``.
    """
    fractions = split if isinstance(split, SplitConfig) else SplitConfig.model_validate(dict(split))
    series = ids if isinstance(ids, pd.Series) else pd.Series(list(ids), dtype=object)
    return assign_split(series, fractions, split_key)


def split_rows(frame: pd.DataFrame, schema: SchemaConfig, *, split_key: int, split: SplitConfig | Mapping[str, float],
               column: str = "split") -> pd.DataFrame:
    """The rows of a raw shard that preparation keeps (schema-valid), each with its split in ``column``.

    ``frame`` is the shard as read from its file (``pandas.read_parquet`` / ``read_csv``, as preparation
    reads it); rows the schema quarantines are left out, as preparation leaves them out. The rows come in
    the file's order, with the schema's canonical types; the prepared split of a shard holds its rows in
    this order too.
    """
    if column in frame.columns:
        raise ValueError(f"the frame already has a column {column!r}; pass another name as column=")
    good, _ = validate(frame, schema)
    return good.assign(**{column: split_of(good[schema.id], split_key=split_key, split=split)})

"""A site's data: validation, features, the deterministic split, preparation and loading.

:func:`split_of` and :func:`split_rows` say which split (train, val or test) each row is in, exactly as
preparation decides it, for a central baseline scored on the same test rows (docs/baselines.md).
"""

from insitu.data.splits import split_of, split_rows

__all__ = ["split_of", "split_rows"]

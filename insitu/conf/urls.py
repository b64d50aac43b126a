"""Store URLs spelt one way only, and whether two stores share objects."""

from __future__ import annotations

import re

from insitu.conf.errors import Refusal

STORE_SCHEMES = ("s3", "file", "memory", "gs", "abfs", "az")
# Schemes whose first path segment is a bucket (or container): DNS-like names, compared ignoring case.
_BUCKET_SCHEMES = ("s3", "gs", "abfs", "az")
# Two spellings of one service: a store named both ways is one store.
_SAME_SERVICE = {"az": "abfs"}


def normalise_store_url(url: str) -> str:
    """``url`` spelt one way only, so that two spellings of one store compare equal.

    The scheme is lower-cased, and so is a bucket (bucket names are DNS-like), empty and ``.`` segments
    are dropped, ``..`` is applied and a trailing ``/`` added: ``S3://Insitu-EU//a/./b/../`` is
    ``s3://insitu-eu/a/``. No message includes the URL (it could hold a pasted credential).

    Raises
    ------
    ValueError
        For another scheme, no bucket, a bucket that is not a plain name, a ``..`` that climbs above the
        bucket (or ``/``), a query string, fragment, %-escape, backslash or whitespace.
    """
    m = re.fullmatch(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", url, flags=re.DOTALL)
    if m is None or m[1].lower() not in STORE_SCHEMES:
        raise ValueError(f"must be an fsspec URL such as s3://bucket/ or file:///abs/path (schemes: "
                         f"{', '.join(STORE_SCHEMES)})")
    scheme, rest = m[1].lower(), m[2]
    # Clients read these differently ('?' starts a query for one, is part of a key for another), so two
    # spellings could name one store without comparing equal.
    if re.search(r"[?#%\\\s]", rest):
        raise ValueError("must not hold a query string (?), fragment (#), %-escape, backslash or whitespace: "
                         "write the plain bucket and prefix, e.g. s3://bucket/prefix/")
    if scheme == "file":
        if not rest.startswith("/"):
            raise ValueError("a file URL needs an absolute path: file:///abs/path (three slashes)")
        root, path = "", rest
    else:
        root, _, path = rest.partition("/")
        if not root:
            raise ValueError(f"names no bucket: write {scheme}://bucket/ or {scheme}://bucket/prefix/")
        # '@' stays allowed for abfs's container@account; a ':' would be a key:secret pasted in.
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._@-]*", root) or root in (".", ".."):
            raise Refusal("the bucket must be a plain name (letters, digits, '.', '_', '-'); credentials never "
                           "go in the URL: name their variables in key_env and secret_env", echo=False)
        if scheme in _BUCKET_SCHEMES:
            root = root.lower()
    kept: list[str] = []
    for seg in path.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if not kept:
                raise ValueError("a '..' segment climbs above the bucket (or /): write the store's own path")
            kept.pop()
        else:
            kept.append(seg)
    return f"{scheme}://{root}/" + "".join(f"{seg}/" for seg in kept)


def stores_overlap(a: str, b: str) -> bool:
    """Whether two stores (normalised URLs) share objects: equal, or one inside the other.

    Both end in ``/``, so a prefix is one at a segment boundary: ``s3://b/eu/`` holds ``s3://b/eu/x/`` but
    not ``s3://b/eu2/``.
    """
    a, b = _one_service(a), _one_service(b)
    return a.startswith(b) or b.startswith(a)


def _one_service(url: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{_SAME_SERVICE.get(scheme, scheme)}://{rest}"

"""Store URLs: one spelling per store (``normalise_store_url``) and when two stores share objects."""

from __future__ import annotations

import re

import pytest

from insitu.conf import normalise_store_url, stores_overlap


@pytest.mark.parametrize(
    ("url", "normal"),
    [
        ("s3://insitu-eu", "s3://insitu-eu/"),
        ("s3://insitu-eu/", "s3://insitu-eu/"),
        ("s3://insitu-eu/x/../", "s3://insitu-eu/"),
        ("S3://Bucket//a/./b", "s3://bucket/a/b/"),
        ("s3://bucket/Raw/EU/", "s3://bucket/Raw/EU/"),  # keys are case-sensitive: only the bucket is folded
        ("GS://B/p", "gs://b/p/"),
        ("file:///tmp//store/./x/../", "file:///tmp/store/"),
        ("FILE:///", "file:///"),
        ("memory://Root/a", "memory://Root/a/"),  # not a bucket: its name keeps its case
        ("abfs://container@account/p/", "abfs://container@account/p/"),
    ],
)
def test_a_store_url_has_one_spelling(url: str, normal: str) -> None:
    assert normalise_store_url(url) == normal
    assert normalise_store_url(normal) == normal


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        ("s3://b/..", "climbs above the bucket"),
        ("s3://b/x/../../y", "climbs above the bucket"),
        ("file:///../etc", "climbs above the bucket (or /)"),
        ("s3://", "names no bucket"),
        ("s3:///b/", "names no bucket"),
        ("s3://../b/", "plain name"),
        ("s3://key:secret@b/", "credentials never go in the URL"),
        ("s3://b/p?x=1", "query string"),
        ("s3://b/p#top", "fragment"),
        ("s3://b/%2E%2E/", "%-escape"),
        ("s3://b/a\\..\\b", "backslash"),
        ("s3://b/a b", "whitespace"),
        ("https://b/", "must be an fsspec URL"),
        ("b/prefix/", "must be an fsspec URL"),
        ("file://relative/dir", "absolute path"),
    ],
)
def test_a_bad_store_url_is_refused_without_echoing_it(url: str, hint: str) -> None:
    with pytest.raises(ValueError, match=re.escape(hint)) as info:
        normalise_store_url(url)
    # the URL itself is never in the message: it could carry a pasted credential
    assert "key:secret" not in str(info.value)
    assert len(url) < 8 or url not in str(info.value)


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("s3://b/", "s3://b/", True),
        ("s3://b/eu/", "s3://b/eu/x/", True),
        ("s3://b/eu/x/", "s3://b/eu/", True),
        ("s3://b/", "s3://b/eu/", True),
        ("az://c/p/", "abfs://c/p/q/", True),  # two spellings of one Azure service
        ("s3://b/eu/", "s3://b/eu2/", False),
        ("s3://b/eu2/", "s3://b/eu/", False),
        ("s3://insitu-eu/", "s3://insitu-eu2/", False),
        ("s3://b/", "gs://b/", False),
        ("file:///data/eu/", "file:///data/us/", False),
    ],
)
def test_stores_overlap_at_segment_boundaries(a: str, b: str, overlap: bool) -> None:
    assert stores_overlap(a, b) is overlap


def test_spellings_of_one_store_overlap_once_normalised() -> None:
    spellings = ["s3://insitu-eu", "s3://insitu-eu/", "s3://insitu-eu/x/../", "S3://INSITU-EU//./"]
    normal = {normalise_store_url(u) for u in spellings}
    assert normal == {"s3://insitu-eu/"}

"""Riding out an unreachable store (insitu.outage): the pauses are deterministic, the total is bounded, and only
an unreachable store is ridden out — a store that answered (404, 403, a bad request) fails at once."""

from __future__ import annotations

import errno
import itertools
from typing import Any

import aiohttp
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from insitu.outage import Outage, StoreUnavailable, is_unreachable
from insitu.storage import OutageTolerantFileSystem, Store


class Clock:
    """A clock that advances only when the code under test sleeps (plus what each call costs)."""

    def __init__(self, call_s: float = 0.0) -> None:
        self.now, self.call_s, self.slept = 0.0, call_s, []  # type: list[float]

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def clock(self) -> float:
        self.now += self.call_s
        return self.now


def _refused() -> EndpointConnectionError:
    """What s3fs raises when nothing listens at the endpoint: botocore's error over aiohttp's over the OS's."""
    try:
        try:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed")
        except ConnectionRefusedError as os_error:
            raise aiohttp.ClientConnectionError("Cannot connect to host") from os_error
    except aiohttp.ClientConnectionError:
        return EndpointConnectionError(endpoint_url="http://127.0.0.1:9/b/k")


def _failing(times: int, then: Any = b"ok") -> Any:
    calls = itertools.count(1)

    def fn() -> Any:
        if next(calls) <= times:
            raise _refused()
        return then

    return fn


def test_the_pauses_double_up_to_the_longest_and_stay_there() -> None:
    assert list(itertools.islice(Outage().waits(), 8)) == [1, 2, 4, 8, 16, 16, 16, 16]
    assert list(itertools.islice(Outage(first_s=0.5, longest_s=3).waits(), 5)) == [0.5, 1, 2, 3, 3]


def test_a_store_back_within_the_bound_answers_the_same_call() -> None:
    c = Clock()
    assert Outage(60).call(_failing(4), what="cat_file", store="s3://b/", sleep=c.sleep, clock=c.clock) == b"ok"
    assert c.slept == [1, 2, 4, 8]


def test_past_the_bound_the_error_names_the_store_the_call_and_the_bound() -> None:
    c = Clock(call_s=5.0)  # each failed call itself takes 5 s (the S3 client's own retries)
    with pytest.raises(StoreUnavailable) as caught:
        Outage(30).call(_failing(99), what="exists", store="s3://insitu-exchange/", sleep=c.sleep, clock=c.clock)
    message = str(caught.value)
    assert "s3://insitu-exchange/" in message and "exists" in message and "30 s" in message
    assert "outage_s" in message and "EndpointConnectionError" in message
    assert isinstance(caught.value.__cause__, EndpointConnectionError)
    # counted from the first failure (at 5 s), the waiting stops before it would pass the bound: it gives up at
    # most one call's time past it
    assert c.now - 5 <= 30 + 5 and c.slept == [1, 2, 4, 8]


def test_a_bound_of_zero_fails_at_the_first_unreachable_answer() -> None:
    c = Clock()
    with pytest.raises(StoreUnavailable):
        Outage(0).call(_failing(1), what="info", store="s3://b/", sleep=c.sleep, clock=c.clock)
    assert c.slept == []


@pytest.mark.parametrize("error", [
    FileNotFoundError("s3://b/k"),
    PermissionError("AccessDenied"),
    ClientError({"Error": {"Code": "InvalidRequest", "Message": "bad"}}, "PutObject"),
    ValueError("not JSON"),
])
def test_a_store_that_answered_is_not_asked_again(error: Exception) -> None:
    c = Clock()

    def fn() -> None:
        raise error

    with pytest.raises(type(error)):
        Outage(60).call(fn, what="info", store="s3://b/", sleep=c.sleep, clock=c.clock)
    assert c.slept == []


def test_what_counts_as_unreachable() -> None:
    assert is_unreachable(_refused())
    assert is_unreachable(TimeoutError()) and is_unreachable(ConnectionResetError())
    wrapped = RuntimeError("reading the split failed")
    wrapped.__cause__ = _refused()
    assert is_unreachable(wrapped)  # through the causes
    assert not is_unreachable(StoreUnavailable("already ridden out to its bound"))
    assert not is_unreachable(FileNotFoundError()) and not is_unreachable(OSError(errno.EIO, "bad"))
    try:  # a refusal raised `from None` while a connection error was being handled is a refusal
        try:
            raise _refused()
        except EndpointConnectionError:
            raise PermissionError("AccessDenied") from None
    except PermissionError as refusal:
        assert not is_unreachable(refusal)


class _LosingAnswers:
    """A filesystem whose first conditional create lands but loses its answer (the store went down mid-reply)."""

    def __init__(self, stored: bytes | None = None) -> None:
        self.stored, self.creates = stored, 0

    def pipe_file(self, path: str, data: bytes, mode: str = "overwrite") -> None:
        self.creates += 1
        if self.stored is not None:
            raise FileExistsError(path)
        self.stored = data
        raise _refused()

    def cat_file(self, path: str) -> bytes:
        assert self.stored is not None
        return self.stored


def _store_on(raw: Any, monkeypatch: pytest.MonkeyPatch) -> Store:
    store = Store("s3://insitu-exchange/", {}, outage_s=60)
    fs = OutageTolerantFileSystem(raw, Outage(60, first_s=0.001), store.url)
    monkeypatch.setattr(Store, "fs", property(lambda self: fs))
    monkeypatch.setattr(Store, "outage", property(lambda self: Outage(60, first_s=0.001)))
    return store


def test_a_conditional_write_whose_answer_was_lost_is_ours_when_the_bytes_are(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _LosingAnswers()
    _store_on(raw, monkeypatch).write_new("anchors/a.json", b"mine")
    assert raw.creates == 2 and raw.stored == b"mine"


def test_a_conditional_write_over_another_writers_object_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileExistsError):
        _store_on(_LosingAnswers(stored=b"theirs"), monkeypatch).write_new("anchors/a.json", b"mine")


def test_a_blind_conditional_create_through_the_tolerant_filesystem_is_refused() -> None:
    fs = OutageTolerantFileSystem(_LosingAnswers(), Outage(60), "s3://b/")
    with pytest.raises(ValueError, match="write_new"):
        fs.pipe_file("b/k", b"x", mode="create")

"""A site's limits on what one shard may be, checked before any parser sees the file.

A shard with a 100 MB header line ran a site's prepare for over 13 minutes, its Dask workers paused at 83 %
memory, with no error. A parser's memory grows with what it is given, so the shard is measured first, with
bounded memory: its size from the store's metadata, then (CSV) every line's length in one streaming pass of
fixed-size blocks and the header's column count, or (Parquet) its footer's column count and widest row group.
A shard over a limit is refused with the shard, the limit and the value named (rule ``limits.<name>``), and
quarantined and audited like an unreadable shard. The limits are the site's own, in its signed policy.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

BLOCK = 1 << 20  # bytes read at a time when measuring lines


class ShardLimits(BaseModel):
    """What one shard may be; a shard over a limit is refused before parsing."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_shard_bytes: Annotated[int, Field(ge=1, description="largest shard file, in bytes")] = 8 << 30
    max_line_bytes: Annotated[int, Field(ge=16, description="longest line of a CSV shard (header included), in "
                                         "bytes")] = 1 << 20
    max_row_bytes: Annotated[int, Field(ge=16, description="widest row of a Parquet shard (a row group's "
                                        "uncompressed bytes per row)")] = 1 << 20
    max_columns: Annotated[int, Field(ge=1, le=1_000_000, description="most columns a shard may have")] = 10_000


@dataclass(frozen=True)
class LimitRefusal:
    """A shard over one of the site's limits."""

    shard: str
    rule: str
    limit: str
    allowed: int
    found: int
    where: str = ""

    @property
    def message(self) -> str:
        at = f" ({self.where})" if self.where else ""
        return (f"shard {self.shard} refused before parsing: {self.found} is over limits.{self.limit} = "
                f"{self.allowed}{at} (rule {self.rule}); fix the file, or the site's admin raises the limit in "
                "the site's policy")


def _refusal(shard: str, limit: str, allowed: int, found: int, where: str = "") -> LimitRefusal:
    return LimitRefusal(shard, "limits." + limit.replace("_", "-"), limit, allowed, found,
                        where)


def check_lines(f: Any, shard: str, limits: ShardLimits) -> LimitRefusal | None:
    """Measure a CSV stream's lines block by block (memory: one block plus the header's start)."""
    line, length, head = 1, 0, b""
    header_done = False
    while block := f.read(BLOCK):
        start = 0
        while True:
            nl = block.find(b"\n", start)
            piece = len(block) - start if nl < 0 else nl - start
            if not header_done and len(head) <= limits.max_line_bytes:
                head += block[start: start + piece][: limits.max_line_bytes + 1 - len(head)]
            length += piece
            if length > limits.max_line_bytes:
                return _refusal(shard, "max_line_bytes", limits.max_line_bytes, length,
                                f"line {line} is at least that long")
            if nl < 0:
                break
            if not header_done:
                header_done = True
                columns = header_columns(head)
                if columns > limits.max_columns:
                    return _refusal(shard, "max_columns", limits.max_columns, columns, "the header line")
            line, length, start = line + 1, 0, nl + 1
    if not header_done and head:
        columns = header_columns(head)
        if columns > limits.max_columns:
            return _refusal(shard, "max_columns", limits.max_columns, columns, "the header line")
    return None


def header_columns(head: bytes) -> int:
    """Columns of a CSV header line (quotes respected; a broken header counts its commas)."""
    text = head.decode("utf-8", "replace").rstrip("\r")
    try:
        return len(next(csv.reader(io.StringIO(text), strict=True), []))
    except csv.Error:
        return text.count(",") + 1


def check_parquet(meta: Any, shard: str, limits: ShardLimits) -> LimitRefusal | None:
    """A Parquet footer's column count and widest row group, against the limits."""
    if meta.num_columns > limits.max_columns:
        return _refusal(shard, "max_columns", limits.max_columns, meta.num_columns, "the file's schema")
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        width = rg.total_byte_size // max(rg.num_rows, 1)
        if width > limits.max_row_bytes:
            return _refusal(shard, "max_row_bytes", limits.max_row_bytes, width, f"row group {g}")
    return None


def check_shard(fs: Any, path: str, shard: str, limits: ShardLimits) -> LimitRefusal | None:
    """The first limit ``path`` (a filesystem path of ``fs``) is over, or None; reads no more than it must."""
    size = int(fs.info(path)["size"])
    if size > limits.max_shard_bytes:
        return _refusal(shard, "max_shard_bytes", limits.max_shard_bytes, size, "the file's size")
    with fs.open(path, "rb", cache_type="none") as f:
        if path.endswith(".csv"):
            return check_lines(f, shard, limits)
        import pyarrow.parquet as pq

        try:
            meta = pq.ParquetFile(f).metadata
        except Exception:  # not Parquet at all: the reader reports it as unreadable, as before
            return None
        return check_parquet(meta, shard, limits)

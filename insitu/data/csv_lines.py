"""Read a CSV shard line by line, so that one malformed line costs that line and nothing else.

A CSV with an unterminated quote turned 49 lines into one quarantined row, with no error: a parser that lets
a quoted field run over line breaks swallows the rest of the file into that field. Shards are tables whose
fields never hold a line break, so here each physical line is one record: a line whose quotes do not close,
or whose field count differs from the header's, is *malformed* and reported with its line number and reason
(and quarantined with them); every other line is kept and parsed as before (pandas' type inference, over the
good lines only).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

import pandas as pd

RULE_MALFORMED = "csv.malformed-line"


@dataclass(frozen=True)
class MalformedLine:
    line: int  # 1-based line number in the file (the header is line 1)
    reason: str
    text: str  # the line itself, cut to 200 characters: it stays in the site's quarantine


def split_lines(text: str) -> tuple[str, list[tuple[int, str]], list[MalformedLine]]:
    """``(header, [(line number, good line)], [malformed lines])`` of a CSV text."""
    # Only "\n" ends a record (a trailing "\r" too: CRLF files): str.splitlines would also break on form
    # feeds, U+2028 and other characters a field may hold, splitting good rows and shifting every line number.
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        return "", [], []
    header = lines[0]
    try:
        width = len(next(csv.reader([header], strict=True)))
    except csv.Error as e:
        return header, [], [MalformedLine(1, f"the header line cannot be read: {e}", header[:200])]
    good: list[tuple[int, str]] = []
    bad: list[MalformedLine] = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            fields = next(csv.reader([line], strict=True))
        except csv.Error as e:
            bad.append(MalformedLine(number, f"quotes do not close on this line ({e})", line[:200]))
            continue
        except StopIteration:
            continue
        if len(fields) != width:
            bad.append(MalformedLine(number, f"{len(fields)} fields where the header has {width}", line[:200]))
            continue
        good.append((number, line))
    return header, good, bad


def read_csv_lines(data: bytes) -> tuple[pd.DataFrame, list[MalformedLine]]:
    """The good lines of a CSV shard as a frame (as ``pd.read_csv`` reads them), and the malformed lines."""
    # Strict: a shard that is not UTF-8 is unreadable (reported), not silently rewritten with U+FFFD.
    header, good, bad = split_lines(data.decode("utf-8"))
    if not header or (bad and bad[0].line == 1):
        return pd.DataFrame(), bad
    body = "\n".join([header, *(line for _, line in good)]) + "\n"
    return pd.read_csv(io.StringIO(body)), bad

"""Shard limits measured before parsing, and CSV shards read line by line (malformed lines reported, not merged)."""

from __future__ import annotations

import io
from pathlib import Path

import fsspec
import pandas as pd
import pytest

from insitu.data.csv_lines import read_csv_lines, split_lines
from insitu.data.limits import ShardLimits, check_lines, check_shard
from insitu.governance.policy import Limits

SMALL = ShardLimits(max_shard_bytes=10_000, max_line_bytes=64, max_row_bytes=64, max_columns=5)


def _csv(tmp_path: Path, text: str, name: str = "s.csv") -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def test_a_long_header_line_is_refused_naming_the_shard_the_limit_and_the_line(tmp_path: Path) -> None:
    fs = fsspec.filesystem("file")
    r = check_shard(fs, _csv(tmp_path, "a" * 100 + "\n1\n"), "eu-009", SMALL)
    assert r is not None and r.rule == "limits.max-line-bytes" and r.limit == "max_line_bytes"
    assert "shard eu-009 refused before parsing" in r.message and "limits.max_line_bytes = 64" in r.message
    assert "line 1" in r.message


def test_a_long_line_anywhere_and_one_without_a_newline_are_refused() -> None:
    lines = b"a,b\n" + b"1,2\n" * 50 + b"x" * 65 + b"\n1,2\n"
    r = check_lines(io.BytesIO(lines), "s", SMALL)
    assert r is not None and "line 52" in r.message
    assert check_lines(io.BytesIO(b"a,b\n" + b"y" * 65), "s", SMALL) is not None
    # measured across the reader's blocks: a line split over two blocks still counts whole
    big = ShardLimits(max_line_bytes=(1 << 20) + 10)
    r = check_lines(io.BytesIO(b"a\n" + b"z" * ((1 << 20) + 11) + b"\n"), "s", big)
    assert r is not None and "line 2" in r.message
    assert check_lines(io.BytesIO(b"a\n" + b"z" * ((1 << 20) + 10) + b"\n"), "s", big) is None


def test_too_many_columns_and_an_oversized_file_are_refused(tmp_path: Path) -> None:
    fs = fsspec.filesystem("file")
    r = check_shard(fs, _csv(tmp_path, "a,b,c,d,e,f\n1,2,3,4,5,6\n"), "s", SMALL)
    assert r is not None and r.rule == "limits.max-columns" and "6 is over limits.max_columns = 5" in r.message
    r = check_shard(fs, _csv(tmp_path, "a\n" + "1\n" * 6000), "s", SMALL)
    assert r is not None and r.rule == "limits.max-shard-bytes" and "12002 is over limits.max_shard_bytes" in r.message
    assert check_shard(fs, _csv(tmp_path, "a,b\n1,2\n"), "s", SMALL) is None


def test_parquet_is_measured_from_its_footer(tmp_path: Path) -> None:
    fs = fsspec.filesystem("file")
    pd.DataFrame({f"c{i}": [1] for i in range(6)}).to_parquet(tmp_path / "wide.parquet")
    r = check_shard(fs, str(tmp_path / "wide.parquet"), "s", ShardLimits(max_columns=5))
    assert r is not None and r.rule == "limits.max-columns"
    pd.DataFrame({"t": ["x" * 500] * 4}).to_parquet(tmp_path / "fat.parquet")
    r = check_shard(fs, str(tmp_path / "fat.parquet"), "s", ShardLimits(max_row_bytes=100))
    assert r is not None and r.rule == "limits.max-row-bytes" and "row group 0" in r.message
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    assert check_shard(fs, str(tmp_path / "junk.parquet"), "s", SMALL) is None  # the reader calls it unreadable


def test_an_unterminated_quote_costs_its_line_not_the_rest_of_the_file() -> None:
    rows = ["id,amount,flag"] + [f"t{i},{i}.5,true" for i in range(48)]
    rows[5] = 't4,"4.5,true'  # the quote never closes
    frame, bad = read_csv_lines(("\n".join(rows) + "\n").encode())
    assert [(m.line, "quotes do not close" in m.reason) for m in bad] == [(6, True)]
    assert len(frame) == 47 and list(frame.columns) == ["id", "amount", "flag"]
    assert "t4" not in set(frame["id"]) and frame["amount"].dtype.kind == "f"  # types inferred as before


def test_lines_with_the_wrong_field_count_are_reported_with_their_numbers() -> None:
    header, good, bad = split_lines('a,b\n1,2\n1,2,3\n\n"x,y",2\n4\n')
    assert [n for n, _ in good] == [2, 5] and [(m.line, m.reason) for m in bad] == [
        (3, "3 fields where the header has 2"), (6, "1 fields where the header has 2")]


def test_a_broken_header_keeps_nothing() -> None:
    frame, bad = read_csv_lines(b'a,"b\n1,2\n')
    assert frame.empty and bad[0].line == 1


def test_the_policy_carries_the_limits_with_defaults_and_bounds() -> None:
    assert Limits().max_line_bytes == 1 << 20 and Limits(max_columns=7).max_columns == 7
    with pytest.raises(ValueError):
        Limits(max_line_bytes=0)
    with pytest.raises(ValueError):
        Limits.model_validate({"max_lines": 3})


def test_prepare_refuses_an_oversized_shard_and_quarantines_malformed_lines(conf_dir: Path, tmp_path: Path) -> None:
    import json

    from insitu.conf import ShardConfig, load_conf
    from insitu.data.prepare import prepare_shard, quarantine_prefix, summarize
    from insitu.data.synthetic import generate
    from insitu.storage import Store

    conf = load_conf("fraud", directory=conf_dir)
    schema, split = conf.dataset.schema_, conf.training.split
    (tmp_path / "raw").mkdir()
    text = generate("eu", 49, seed=3).to_csv(index=False).splitlines()
    text[10] = text[10].replace(",", ',"', 1)  # line 11: a quote that never closes
    (tmp_path / "raw/s.csv").write_text("\n".join(text) + "\n")
    store = Store(f"file://{tmp_path}/", {})
    shard = ShardConfig(id="eu-csv", site="eu", path="raw/s.csv")

    rep = prepare_shard(store, shard, schema, split, 7, "fraud", "job-1", Limits())
    assert rep.error is None and rep.malformed_lines == [11]
    assert (rep.rows_read, rep.rows_quarantined, rep.rows_prepared) == (49, 1, 48)
    quarantined = json.loads((tmp_path / quarantine_prefix("fraud", "job-1") / "eu-csv.malformed-lines.json")
                             .read_text())
    assert [e["line"] for e in quarantined["lines"]] == [11] and quarantined["rule"] == "csv.malformed-line"
    assert "malformed_lines" not in summarize([rep])["shards"]["eu-csv"]  # stays on the site

    small = Limits(max_line_bytes=40)
    rep = prepare_shard(store, shard, schema, split, 7, "fraud", "job-2", small)
    assert rep.refused_rule == "limits.max-line-bytes" and rep.rows_read == 0
    assert rep.error and "shard eu-csv refused before parsing" in rep.error and "line 1" in rep.error
    reason = json.loads((tmp_path / quarantine_prefix("fraud", "job-2") / "eu-csv.reason.json").read_text())
    assert reason["rule"] == "limits.max-line-bytes"
    assert not (tmp_path / quarantine_prefix("fraud", "job-2") / "eu-csv.unreadable").exists()  # not copied


def test_only_a_newline_ends_a_csv_record_and_a_shard_that_is_not_utf8_is_unreadable() -> None:
    # A form feed or U+2028 inside a field is data, not a line break: no good row is split, numbers stay right.
    header, good, bad = split_lines("a,b\r\nx\fy,1\r\nu\u2028v,2\r\n1,2,3\r\n")
    assert header == "a,b" and [n for n, _ in good] == [2, 3] and [b.line for b in bad] == [4]
    with pytest.raises(UnicodeDecodeError):
        read_csv_lines("a,b\ncaf\u00e9,1\n".encode("latin-1"))

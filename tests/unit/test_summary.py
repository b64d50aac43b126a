"""The job summary table: one source of rows for the terminal and the Prefect artifact."""

from __future__ import annotations

from pathlib import Path

from insitu.summary import summary_columns, summary_markdown, summary_rows

SUMMARY = {
    "job_id": "j1", "rounds": 2, "config_hash": "abc",
    "sites": {"eu": {"rows_prepared": 1000, "rows_quarantined": 5, "shards_unreadable": [], "raw_bytes": 9000,
                     "rounds_contributed": 2, "metrics": {"roc_auc": 0.9, "pr_auc": 0.3, "loss": 0.5, "count": 150},
                     "bytes_to_exchange": {"update": 400, "stats": 100}},
              "apac": {"rows_prepared": 800, "rows_quarantined": 0, "shards_unreadable": ["apac-002"],
                       "raw_bytes": 7000, "rounds_contributed": 1, "metrics": {}, "bytes_to_exchange": {}}},
    "global_metrics": {"roc_auc": 0.85, "pr_auc": 0.25, "loss": 0.6, "count": 150},
    "bytes_crossed": 1700, "bytes_crossed_by_writer": {"coordinator": {"weights": 1200}, "eu": {"update": 500}},
    "raw_bytes": 16000,
    "model": {"model_name": "m", "version": "3", "alias": "challenger", "gate": {"passed": False, "reason": "worse"}},
}


def test_rows_follow_the_columns_and_end_with_the_global_row() -> None:
    rows = summary_rows(SUMMARY)
    assert all(len(r) == len(summary_columns(SUMMARY)) for r in rows)
    assert rows[0] == ["eu", "1,000", "5", "-", "2", "0.9000", "0.3000", "0.5000", "150", "500", "9,000"]
    assert rows[1][3] == "apac-002" and rows[1][5] == "nan"
    assert rows[-1][0].startswith("global") and rows[-1][6] == "0.2500"
    assert rows[-1][9] == "1,700 (coordinator 1,200)"


def test_the_columns_are_the_tasks_metrics() -> None:
    regression = {**SUMMARY, "task": "regression", "metric_names": ["rmse", "mae", "r2"],
                  "global_metrics": {"rmse": 1.5, "mae": 1.0, "r2": 0.7, "count": 150}}
    cols = summary_columns(regression)
    assert cols[5:8] == ["RMSE", "MAE", "R²"] and "PR-AUC" not in cols
    assert summary_rows(regression)[-1][5:8] == ["1.5000", "1.0000", "0.7000"]


def test_markdown_has_the_gate_and_one_line_per_row() -> None:
    md = summary_markdown(SUMMARY)
    assert "Gate: **failed** — worse" in md
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(summary_rows(SUMMARY))


def test_the_summary_says_which_identity_ran_each_step(tmp_path: Path) -> None:
    import torch
    from protocol_examples import evaluation, prepare_stats

    from insitu.federated.exchange import Exchange
    from insitu.storage import Store
    from insitu.summary import collect_identities, identity_lines

    store = Store(f"file://{tmp_path}/", {})
    eu = {"actor": "eu", "os_user": "insitu-eu", "pool": "insitu-eu"}
    ex_eu = Exchange(store, "j", "eu")
    ex_eu.put_json("stats", "prepare.json", {**prepare_stats("eu"), "ran_as": eu})
    base = Exchange(store, "j", "coordinator").put_state("weights", "round-0000", {"w": torch.zeros(1)}, round=0)
    ex_eu.put_state("update", "round-0000", {"w": torch.zeros(1)}, reference={"w": torch.zeros(1)}, ran_as=eu,
                    round=0, n_samples=100, base_sha256=base["sha256"])
    ex_eu.put_json("metrics", "evaluate.json", {**evaluation("eu"), "ran_as": eu})
    coord = {"actor": "coordinator", "os_user": "insitu-coordinator", "pool": "insitu-coordinator"}
    ids = collect_identities(Exchange(store, "j", "coordinator"), coord, ["eu"], ["eu"], n_rounds=1)
    assert ids == {"coordinator": {"plan, aggregate, register": coord},
                   "eu": {"prepare": eu, "train": eu, "evaluate": eu}}
    from_json = {a: dict(sorted(st.items())) for a, st in sorted(ids.items(), reverse=True)}  # keys sorted
    lines = identity_lines({"ran_as": from_json})
    assert lines[1] == ("eu: prepare as insitu-eu on pool insitu-eu; train as insitu-eu on pool insitu-eu; "
                        "evaluate as insitu-eu on pool insitu-eu")


def test_sites_left_out_by_the_row_floor_are_named() -> None:
    from insitu.summary import withheld_by_floor, withheld_line

    evaluated = {"eu": {"round-0005": {"roc_auc": 0.8, "hist_pos": [20], "hist_neg": [40]}},
                 "us": {"round-0005": {"roc_auc": 0.7}},
                 "apac": {"round-0005": {"withheld": "fewer than 20 rows"}}}
    w = withheld_by_floor(evaluated, "round-0005")
    assert w == {"test metrics": ["apac"], "PR curve": ["apac", "us"]}
    line = withheld_line({"withheld": w})
    assert line is not None and "test metrics: apac" in line and "PR curve: apac, us" in line
    assert withheld_line({"withheld": {"PR curve": []}}) is None


def test_the_summary_names_the_sites_whose_numbers_were_refused_or_disagreed() -> None:
    md = summary_markdown({**SUMMARY, "suspects": {"apac": ["the validation of global model 0 of apac counts "
                                                            "1,000,000,000,000 rows", "pr_auc differs"]}})
    assert "Sites whose reported numbers were refused or disagreed with the others:" in md
    assert "- apac: the validation of global model 0 of apac counts 1,000,000,000,000 rows; pr_auc differs" in md
    assert "refused or disagreed" not in summary_markdown(SUMMARY)

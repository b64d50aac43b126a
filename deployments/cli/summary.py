"""The summary ``insitu run`` prints when a job ends: per-site metrics, the model registered, who ran it."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from deployments.cli.common import console


def print_summary(s: dict[str, Any]) -> None:
    from insitu.summary import identity_lines, summary_columns, summary_rows, withheld_line

    t = Table(title=f"insitu job {s['job_id']} — {s['rounds']} federated rounds", show_lines=False)
    for col in summary_columns(s):
        t.add_column(col, justify="left" if col in ("site", "unreadable shards") else "right")
    for row in summary_rows(s):
        t.add_row(*row)
    console.print(t)
    m = s["model"]
    console.print(f"registered [bold]{m['model_name']}[/bold] version [bold]{m['version']}[/bold] "
                  f"with alias [bold]{m['alias']}[/bold] (MLflow run {m['run_id']})")
    if "selected_round" in s:
        early = " (stopped early)" if s.get("stopped_early") else ""
        console.print(f"it is global model {s['selected_round']} of {s['rounds']}{early}: {s.get('selection', '')}")
    gate = m.get("gate", {})
    if gate:
        console.print(f"gate {'[green]passed[/green]' if gate['passed'] else '[yellow]failed[/yellow]'}: "
                      f"{gate['reason']} (champion: v{gate['champion']})")
    for line in identity_lines(s):
        console.print(f"ran as — {line}")
    if (line := withheld_line(s)) is not None:
        console.print(line)
    console.print(f"bytes that crossed a border: {s['bytes_crossed']:,} (model weights, updates, aggregate "
                  f"statistics, metrics); raw data that stayed in its region: {s['raw_bytes']:,} bytes; rows moved: 0")

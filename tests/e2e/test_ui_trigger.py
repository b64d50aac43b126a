"""Users trigger runs from the Prefect UI: log in, open the retrain deployment, fill the form, submit, it completes.

Drives Debian's Chromium (headless) with Playwright; `.ci/run` installs Chromium.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from platform_helpers import RETRAIN, wait_for_flow_run
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId

from deployments.platform import Platform

pytestmark = pytest.mark.e2e
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def test_custom_run_from_the_ui_form_completes(deployed: Platform, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Chromium is required (apt-get install chromium; .ci/run does it)"
    with get_client(sync_client=True) as c:
        dep = c.read_deployment_by_name(RETRAIN)
    job_id = f"ui-{uuid.uuid4().hex[:6]}"
    with sync_playwright() as p:
        # Chromium puts its singleton socket under TMPDIR; the platform's TMPDIR is too long a path for a
        # UNIX socket (108 bytes), so give the browser a short one.
        short_tmp = tempfile.mkdtemp(prefix="chr", dir="/tmp")
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS,
                                    env={**os.environ, "TMPDIR": short_tmp})
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{deployed.prefect_ui_url}/deployments/deployment/{dep.id}", wait_until="networkidle")
            # Authentication is on: the UI asks for the server's auth string before it shows anything.
            password = page.locator("input[type=password]")
            password.wait_for(state="visible", timeout=30_000)
            password.fill(deployed.prefect_auth)
            page.get_by_role("button", name="Login").click()
            password.wait_for(state="detached", timeout=30_000)
            page.goto(f"{deployed.prefect_ui_url}/deployments/deployment/{dep.id}", wait_until="networkidle")
            page.get_by_role("button", name="Run", exact=True).click()
            page.get_by_text("Custom run", exact=True).click()
            page.wait_for_url(re.compile(r"/run(\?|$)"), timeout=30_000)
            # the pydantic RetrainParams model is rendered as a validated form
            for label in ("Training (Optional)", "Rounds (Optional)", "Local Epochs (Optional)"):
                page.wait_for_selector(f"text={label}", state="visible", timeout=15_000)
            # Fields are found by their label, not their place: the form's order is the schema's ``position``.
            labels = [t.strip() for t in page.locator(".schema-form-property__label").all_inner_texts()]
            assert labels[1:4] == ["Training (Optional)", "Dataset (Optional)", "Job Id (Optional)"], labels

            def field(label: str) -> Any:
                return page.locator(".schema-form-property").filter(
                    has=page.locator(":scope > .p-label__header", has_text=label))

            job_field, rounds_field = field("Job Id (Optional)"), field("Rounds (Optional)")
            job_field.get_by_role("button", name="str", exact=True).click()  # Job Id: set a string
            job_field.locator("textarea").fill(job_id)
            rounds_field.get_by_role("button", name="int", exact=True).click()  # Rounds: set an int
            rounds_field.locator("input[type=number]").fill("1")
            page.screenshot(path=str(tmp_path / "form.png"), full_page=True)
            for attempt in range(3):
                with page.expect_response(lambda r: "create_flow_run" in r.url, timeout=60_000) as answer:
                    page.get_by_role("button", name="Submit").click()
                created = answer.value
                # SQLite under this 2-core CI load sometimes answers 5xx; a user would press Submit again.
                if created.status < 500 or attempt == 2:
                    break
                page.wait_for_timeout(3_000)
            page.screenshot(path=str(tmp_path / "submitted.png"), full_page=True)
            assert created.ok, f"the UI's create_flow_run got HTTP {created.status}: {created.text()[:2000]}"
            # The UI routes back client-side and shows a toast; the run itself is checked via the API below.
        finally:
            browser.close()
    deadline = time.monotonic() + 1200
    with get_client(sync_client=True) as c:
        run_id = None
        while run_id is None and time.monotonic() < deadline:
            created = c.read_flow_runs(
                flow_run_filter=FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(any_=[dep.id])))
            run_id = next((r.id for r in created if r.parameters.get("params", {}).get("job_id") == job_id), None)
            time.sleep(1)
    assert run_id is not None, "submitting the form created no flow run"
    fr = wait_for_flow_run(run_id, deadline - time.monotonic(), poll_s=3)
    with get_client(sync_client=True) as c:
        runs = c.read_flow_runs(flow_run_filter=FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(any_=[dep.id])))
    assert fr.parameters["params"]["job_id"] == job_id and fr.parameters["params"]["rounds"] == 1
    assert fr.state.is_completed(), fr.state.message
    assert any(r.id == fr.id for r in runs)
    # and the orchestration-overhead benchmark can analyse it (bench/pipeline_overhead.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from pipeline_overhead import analyse

    report = analyse(run_id)
    assert report["job_id"] == job_id and len(report["rounds"]) == 1
    assert set(report["phases"]) == {"prepare", "train", "evaluate"}
    assert report["phases"]["train"]["slowest_site_compute_s"] > 0

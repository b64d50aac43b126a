"""A site refuses to read another site's shard, even when asked directly, and audits the refusal."""

from __future__ import annotations

import pytest
from prefect.deployments import run_deployment

from insitu.governance.audit import read_events, verify
from insitu.stack import Platform

pytestmark = pytest.mark.e2e


def test_us_refuses_an_eu_shard_and_audits_it(deployed: Platform) -> None:
    before = len(read_events(deployed.audit_log("us")))
    fr = run_deployment("site-prepare/us",
                        parameters={"job_id": "e2e-refusal", "shards": ["eu-000"], "requested_by": "mallory"},
                        timeout=600, poll_interval=1)
    assert fr.state.is_failed()
    assert "site 'us' refuses to read shard 'eu-000'" in fr.state.message
    assert "pinned to site 'eu'" in fr.state.message
    new = read_events(deployed.audit_log("us"))[before:]
    refused = [e for e in new if e["event"] == "residency.refused"]
    assert len(refused) == 1
    f = refused[0]["fields"]
    assert (f["shard"], f["requested_by"], f["pinned_to"], f["job_id"]) == ("eu-000", "mallory", "eu", "e2e-refusal")
    assert f["rule"] == "residency.shard-pinned-to-site"
    assert not any(e["event"] == "data.read" for e in new)
    assert verify(deployed.audit_log("us"), deployed.audit_key("us")).ok

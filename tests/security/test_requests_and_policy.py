"""Signed requests and each site's own policy, attacked on the running platform.

Whoever can reach the Prefect API can start a site's flow with any parameters. The site admits only a
request signed by a principal its own policy lists and permits; every refusal names its rule, and is in
the site's audit log with the principal as verified (or as claimed, marked unverified).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import typer
from platform_helpers import job_events, run_dispatched, run_flow
from prefect.client.schemas.objects import FlowRun

from deployments.cli import signing as governance
from deployments.platform import REPO, Platform, PlatformError
from insitu.governance.audit import verify
from insitu.governance.identity import write_private
from insitu.governance.policy import SitePolicy, sign_policy
from insitu.governance.principals import load_private_key

pytestmark = pytest.mark.e2e


def _run_prepare(site: str, params: dict[str, Any], timeout: float = 300) -> FlowRun:
    return run_flow(f"site-prepare/{site}", params, timeout)


def _file_mode(p: Platform) -> int:
    """The mode of the files the admin shares with its runtime (group-readable only when they are two users)."""
    return 0o640 if p.isolate else 0o600


def _decisions(p: Platform, site: str, job_id: str) -> list[dict[str, Any]]:
    return [e["fields"] for e in job_events(p, site, job_id, "policy.decision", "policy.refused")]


def _forged(p: Platform, job_id: str) -> dict[str, Any]:
    """alice's name on a request the operator signed (the coordinator's operator has no key of alice's)."""
    from insitu.conf import load_training, trusted_training
    from insitu.governance.request import new_request, sign_request, training_sha256

    digest = training_sha256(load_training(trusted_training("fraud", p.conf_dir)))
    req = new_request("alice", "fraud", "fraud", digest, "fraud-detection", job_id=job_id)
    return sign_request(req, load_private_key(p.principal_key_file("operator"))).model_dump(mode="json")


@pytest.mark.parametrize("case, rule", [
    ("unsigned", "request.present"),
    ("expired", "request.not-expired"),
    ("forged", "request.signature"),
    ("altered", "request.signature"),
    ("out-of-role", "default-deny"),
    ("other-purpose", "default-deny"),
])
def test_a_site_refuses_requests_its_policy_does_not_admit(deployed: Platform, signer: Any, case: str,
                                                           rule: str) -> None:
    job_id = f"e2e-policy-{case}-{uuid.uuid4().hex[:6]}"
    request: Any = None
    if case == "expired":
        request = signer(job_id=job_id, ttl=timedelta(seconds=1))
        time.sleep(1.5)
    elif case == "forged":
        request = _forged(deployed, job_id)
    elif case == "altered":  # signed for 2 rounds; someone on the way makes it 50
        request = signer(job_id=job_id, overrides={"rounds": 2})
        request["request"]["overrides"] = {"rounds": 50}
    elif case == "out-of-role":
        request = signer(job_id=job_id, principal="operator")
    elif case == "other-purpose":
        request = signer(job_id=job_id, purpose="marketing")
    params = {"job_id": job_id, "shards": ["eu-000"], "request": request}
    if case == "altered":
        params["overrides"] = {"rounds": 50}
    fr = _run_prepare("eu", params)
    assert fr.state.is_failed(), fr.state
    assert f"rule {rule}" in fr.state.message and "site 'eu' refuses prepare" in fr.state.message, fr.state.message
    (decision,) = _decisions(deployed, "eu", job_id)
    assert decision["allowed"] is False and decision["rule"] == rule
    # The principal recorded is the verified one: none, unless the signature checked out.
    assert decision["principal"] == ({"out-of-role": "operator", "other-purpose": "alice",
                                      "expired": "alice"}.get(case))
    assert not job_events(deployed, "eu", job_id, "data.read")
    assert verify(deployed.audit_log("eu"), deployed.audit_key("eu")).ok


def test_a_signed_request_is_admitted_with_the_verified_principal(deployed: Platform, signer: Any) -> None:
    job_id = f"e2e-policy-ok-{uuid.uuid4().hex[:6]}"
    fr = run_dispatched(deployed, "site-prepare/eu", {"job_id": job_id, "request": signer(job_id=job_id)})
    assert fr.state.is_completed(), fr.state.message
    (decision,) = _decisions(deployed, "eu", job_id)
    assert decision["allowed"] and decision["principal"] == "alice"
    assert decision["rule"] == "data-scientists-fraud-detection"
    reads = job_events(deployed, "eu", job_id, "data.read")
    assert reads and all(e["fields"]["principal"] == "alice" for e in reads)


def test_only_a_site_admin_can_change_a_sites_policy(deployed: Platform, signer: Any) -> None:
    original = deployed.policy_file("us").read_text()
    current = SitePolicy.model_validate(json.loads(original)["policy"])
    # Through the CLI: alice is no admin of us, the policy is not written.
    with pytest.raises(typer.Exit):
        governance.apply(deployed, "us", "alice", None, None, 1)
    assert deployed.policy_file("us").read_text() == original
    # Through the site's install path (its admin's): a policy signed by alice (admitting anything) is refused.
    lax = current.model_copy(update={"version": current.version + 1,
                                     "cedar": "@id(\"anything\") permit (principal, action, resource);"})
    bundle = sign_policy(lax, "alice", load_private_key(deployed.principal_key_file("alice")))
    with pytest.raises(PlatformError, match="policy.signed-by-site-admin"):
        deployed.install_policy("us", bundle.model_dump_json())
    assert deployed.policy_file("us").read_text() == original
    # Around it (written in the admin's place by someone who could): the site refuses to load it.
    admin, runtime = deployed.admin_account("us"), deployed.account("us")
    write_private(deployed.policy_file("us"), bundle.model_dump_json(), admin.uid, runtime.gid, _file_mode(deployed))
    try:
        job_id = f"e2e-policy-lax-{uuid.uuid4().hex[:6]}"
        fr = _run_prepare("us", {"job_id": job_id, "shards": ["us-000"],
                                 "request": signer(job_id=job_id, purpose="marketing")})
        assert fr.state.is_failed() and "policy.signed-by-site-admin" in fr.state.message, fr.state.message
        (refusal,) = _decisions(deployed, "us", job_id)
        assert refusal["rule"] == "policy.signed-by-site-admin" and "'alice'" in refusal["reason"]
        # The admin's next `apply` does not carry the planted rules over into a policy it signs.
        planted = deployed.policy_file("us").read_text()
        with pytest.raises(typer.Exit):
            governance.apply(deployed, "us", "us-admin", None, None, 50)
        assert deployed.policy_file("us").read_text() == planted
    finally:
        write_private(deployed.policy_file("us"), original, admin.uid, runtime.gid, _file_mode(deployed))
    # The site admin may: a new version that no longer admits evaluation, seen by `policy check` at once.
    cedar = current.cedar.replace(', Insitu::Action::"evaluate"]', "]")
    path = deployed.dir / "tmp" / "us-no-evaluate.cedar"
    path.write_text(cedar)
    try:
        governance.apply(deployed, "us", "us-admin", path, None, None)
        assert json.loads(deployed.policy_file("us").read_text())["policy"]["version"] == current.version + 1
        assert governance.check(deployed, "us", "train", None, "alice", "fraud", "fraud", "fraud-detection",
                                "e2e-check", {})
        assert not governance.check(deployed, "us", "evaluate", None, "alice", "fraud", "fraud", "fraud-detection",
                                    "e2e-check", {})
    finally:  # back to the original rules, as a newer version (versions only grow)
        path.write_text(current.cedar)
        governance.apply(deployed, "us", "us-admin", path, None, None)


def test_a_site_scores_only_the_jobs_final_model_and_the_champion(deployed: Platform, signer: Any) -> None:
    """A coordinator may not use a site's test rows as an oracle for weights of its choosing."""
    job_id = f"e2e-oracle-{uuid.uuid4().hex[:6]}"
    fr = run_dispatched(deployed, "site-evaluate/eu", {"job_id": job_id, "weights": ["round-0001"],
                                                       "request": signer(job_id=job_id)})
    assert fr.state.is_failed() and "rule evaluate.one-selected-round" in fr.state.message, fr.state.message
    events = job_events(deployed, "eu", job_id)
    assert [e["event"] for e in events] == ["policy.decision", "evaluate.refused"]
    assert events[1]["fields"]["principal"] == "alice"


def test_a_site_imports_no_code_a_caller_names_before_it_admits_the_run(deployed: Platform) -> None:
    """A caller who may start a site's flow names a module as the model in `overrides`. The site parses the
    configuration, refuses the unsigned run, and never imports the module (resolving a model name imports code, so
    it waits until the policy admitted the run)."""
    probe = f"e2e_import_probe_{uuid.uuid4().hex[:8]}"
    marker_dir = Path(tempfile.mkdtemp(dir="/tmp"))
    marker_dir.chmod(0o777)  # the site's OS user could write here, had it imported the probe
    marker = marker_dir / "imported"
    module = REPO / f"{probe}.py"
    module.write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
                      "def make(n_features, n_outputs):\n    raise RuntimeError('never built')\n")
    module.chmod(0o644)
    job_id = f"e2e-policy-import-{uuid.uuid4().hex[:6]}"
    try:
        fr = _run_prepare("eu", {"job_id": job_id, "shards": ["eu-000"], "request": None,
                                 "overrides": {"model": {"name": f"{probe}:make"}}})
        assert fr.state.is_failed() and "rule request.present" in fr.state.message, fr.state.message
        (decision,) = _decisions(deployed, "eu", job_id)
        assert decision["allowed"] is False and decision["rule"] == "request.present"
        assert not marker.exists(), "the site imported a module the caller named before admitting the run"
    finally:
        module.unlink(missing_ok=True)
        shutil.rmtree(marker_dir, ignore_errors=True)

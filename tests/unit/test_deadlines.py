"""A site still preparing at the prepare deadline is left out with the reason; the quorum rule decides."""

from __future__ import annotations

from insitu.conf.training import FederationConfig
from insitu.federated.deadlines import missed_deadline
from insitu.federated.quorum import quorum_refusal


def test_sites_still_running_at_the_deadline_are_named_with_the_setting() -> None:
    late = missed_deadline({"eu": True, "us": False}, 60, "prepare", "federation.prepare_deadline_s")
    assert list(late) == ["us"]
    assert "still running after 60s (federation.prepare_deadline_s)" in late["us"] and "left out" in late["us"]
    assert quorum_refusal("prepare", ["eu"], late, 1) is None  # the quorum holds without the late site
    assert "us: missed the prepare deadline" in (quorum_refusal("prepare", ["eu"], late, 2) or "")


def test_the_prepare_deadline_has_a_default_below_the_phase_timeout() -> None:
    assert FederationConfig().prepare_deadline_s == 900.0

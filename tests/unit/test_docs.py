"""The docs describe the shipped default site policy as it is: quoted verbatim, and its names in the walkthrough."""

from __future__ import annotations

import re
from pathlib import Path

from insitu.governance.policy import DEFAULT_CEDAR

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_governance_quotes_the_default_policy_verbatim() -> None:
    text = (DOCS / "governance.md").read_text(encoding="utf-8")
    assert f"```cedar\n{DEFAULT_CEDAR}```" in text, "docs/governance.md's copy of DEFAULT_CEDAR differs from the code"


def test_bring_your_own_names_everything_the_default_policy_admits() -> None:
    text = (DOCS / "bring-your-own.md").read_text(encoding="utf-8")
    section = text.split("## (f)", 1)[1].split("\n## ", 1)[0]
    # Every quoted name of the policy: rule ids, role, actions, datasets, purposes, strategies, aggregators, models.
    names = set(re.findall(r'"([^"\n]+)"', DEFAULT_CEDAR))
    assert {"fraud", "data-scientist", "ddp", "fedavg", "tabular_mlp"} <= names  # the pattern still finds them
    missing = sorted(n for n in names if f"`{n}`" not in section)
    assert not missing, f"docs/bring-your-own.md (f) does not mention what the default policy names: {missing}"


def test_the_configuration_reference_is_generated_from_the_models() -> None:
    """docs/configuration.md's reference is what the models and each component's Options say (regenerate with
    ``python -m deployments.reference``); a field added without regenerating fails here."""
    from deployments.reference import DOC, reference, rewritten

    text = DOC.read_text(encoding="utf-8")
    assert rewritten(text) == text, "run: python -m deployments.reference"
    generated = reference()
    for key in ("`optimizer.lr`", "`parallel.fsdp.mixed_precision`", "`aggregator.options.mu`",
                "`federation.asynchronous.staleness.function`", "`datasets.<name>.shards[…].site`"):
        assert key in generated, key

"""Site policy decisions on signed requests (pure: keys in a temporary directory, Cedar evaluated for real)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from insitu.governance.default_policy import (
    DATASET_RULES,
    MAX_ROUNDS,
    REVIEWED_AGGREGATORS,
    REVIEWED_STRATEGIES,
    DatasetRule,
)
from insitu.governance.policy import (
    DEFAULT_CEDAR,
    PolicyError,
    PrincipalEntry,
    SitePolicy,
    check_cedar,
    decide,
    sign_policy,
    verify_policy,
)
from insitu.governance.principals import load_private_key, new_key_pair
from insitu.governance.request import new_request, parse_signed, sign_request

HASH = "ab" * 32
CTX = {"strategy": "ddp", "aggregator": "fedavg", "task": "binary", "model": "tabular_mlp",
       "rounds": 5, "local_epochs": 1, "ranks_per_site": 2,
       "batch_size": 256}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    for name in ("alice", "mallory", "operator", "eu-admin"):
        new_key_pair(d, name)
    return d


def pub(keys: Path, name: str) -> str:
    return (keys / f"{name}.pub").read_text().strip()


@pytest.fixture(scope="module")
def policy(keys: Path) -> SitePolicy:
    return SitePolicy(site="eu", version=1, issued_at=datetime.now(UTC), cedar=DEFAULT_CEDAR, principals={
        "alice": PrincipalEntry(public_key=pub(keys, "alice"), roles=["data-scientist"]),
        "operator": PrincipalEntry(public_key=pub(keys, "operator"), roles=["coordinator-operator"]),
        "eu-admin": PrincipalEntry(public_key=pub(keys, "eu-admin"), roles=["site-admin"]),
    })


def signed(keys: Path, signer: str = "alice", principal: str = "alice", **kw: object) -> dict:
    args = {"dataset": "fraud", "training": "fraud", "training_hash": HASH, "purpose": "fraud-detection",
            "job_id": "job-1"}
    args.update(kw)  # type: ignore[arg-type]
    req = new_request(principal, **args)  # type: ignore[arg-type]
    return sign_request(req, load_private_key(keys / f"{signer}.key")).model_dump(mode="json")


def run(policy: SitePolicy, request: object, action: str = "train", **kw: object):  # type: ignore[no-untyped-def]
    args = {"dataset": "fraud", "job_id": "job-1", "training": "fraud", "training_hash": HASH, "overrides": None,
            "context": CTX}
    args.update(kw)
    return decide(policy, request, action=action, **args)  # type: ignore[arg-type]


def test_a_signed_request_within_policy_is_admitted_by_the_named_rule(policy: SitePolicy, keys: Path) -> None:
    d = run(policy, signed(keys))
    assert d.allowed and d.principal == "alice" and d.rule == "data-scientists-fraud-detection"
    assert d.request and len(d.request) == 64


@pytest.mark.parametrize("case, rule", [
    ("unsigned", "request.present"),
    ("malformed", "request.well-formed"),
    ("unknown", "request.known-principal"),
    ("forged", "request.signature"),
    ("altered", "request.signature"),
    ("expired", "request.not-expired"),
    ("other-job", "request.job"),
    ("other-dataset", "request.dataset"),
    ("other-action", "request.action"),
    ("changed-training", "request.training"),
    ("other-overrides", "request.overrides"),
    ("out-of-role", "default-deny"),
    ("wrong-purpose", "default-deny"),
])
def test_each_bad_request_is_refused_by_its_rule(policy: SitePolicy, keys: Path, case: str, rule: str) -> None:
    kw: dict[str, object] = {}
    req: object
    if case == "unsigned":
        req = None
    elif case == "malformed":
        req = {"request": {"principal": "alice"}, "signature": "00"}
    elif case == "unknown":
        req = signed(keys, signer="mallory", principal="mallory")
    elif case == "forged":  # mallory signs a request in alice's name
        req = signed(keys, signer="mallory", principal="alice")
    elif case == "altered":  # a coordinator raises the rounds after alice signed
        req = signed(keys, overrides={"rounds": 2})
        req["request"]["overrides"] = {"rounds": 40}
        kw["overrides"] = {"rounds": 40}
    elif case == "expired":
        req = signed(keys, ttl=timedelta(seconds=1))
        kw["now"] = datetime.now(UTC) + timedelta(minutes=1)
    elif case == "other-job":
        req = signed(keys, job_id="job-2")
    elif case == "other-dataset":
        req = signed(keys, dataset="claims")
    elif case == "other-action":
        req = signed(keys, actions=["evaluate"])
    elif case == "changed-training":
        req = signed(keys)
        kw["training_hash"] = "cd" * 32
    elif case == "other-overrides":
        req = signed(keys)
        kw["overrides"] = {"rounds": 3}
    elif case == "out-of-role":  # the operator is known to the site but no rule permits its role
        req = signed(keys, signer="operator", principal="operator")
    else:
        req = signed(keys, purpose="marketing")
    d = run(policy, req, **kw)
    assert not d.allowed and d.rule == rule, d.reason
    assert f"rule {rule}" in d.reason and "site 'eu' refuses train" in d.reason


def test_forbid_wins_and_is_named(policy: SitePolicy, keys: Path) -> None:
    approval = signed(keys, job_id=None, override_bounds={"rounds": {"min": 1, "max": 40}})
    assert run(policy, approval, job_id="any", overrides={"rounds": 10}).allowed
    d = run(policy, approval, job_id="any", overrides={"rounds": 30}, context={**CTX, "rounds": 30})
    assert not d.allowed and d.rule == "standing-approvals-at-most-20-rounds"
    d = run(policy, approval, job_id="any", overrides={"rounds": 41}, context={**CTX, "rounds": 41})
    assert not d.allowed and d.rule == "request.overrides"


def test_an_approval_bounds_what_the_job_really_runs_not_only_its_overrides(policy: SitePolicy, keys: Path) -> None:
    approval = signed(keys, job_id=None, override_bounds={"rounds": {"min": 1, "max": 3}})
    d = run(policy, approval, job_id="any", context={**CTX, "rounds": 5})  # the config's 5 rounds, no override
    assert not d.allowed and d.rule == "request.overrides" and "rounds = 5" in d.reason


def test_a_rule_that_cannot_be_evaluated_denies(policy: SitePolicy, keys: Path) -> None:
    cedar = policy.cedar + '\n@id("overflowing")\nforbid (principal, action, resource) ' \
        "when { context.rounds * 4611686018427387904 > 5 };"
    d = run(policy.model_copy(update={"cedar": cedar}), signed(keys))
    assert not d.allowed and d.rule == "cedar.evaluation-error", d.reason


def test_a_policy_loads_only_when_signed_by_a_site_admin(policy: SitePolicy, keys: Path) -> None:
    admins = {"eu-admin": pub(keys, "eu-admin")}
    good = sign_policy(policy, "eu-admin", load_private_key(keys / "eu-admin.key"))
    assert verify_policy(good, "eu", admins) == policy
    by_alice = sign_policy(policy, "alice", load_private_key(keys / "alice.key"))
    with pytest.raises(PolicyError, match="'alice'.*not one of its site admins.*policy.signed-by-site-admin"):
        verify_policy(by_alice, "eu", admins)
    forged = sign_policy(policy, "eu-admin", load_private_key(keys / "mallory.key"))
    with pytest.raises(PolicyError, match="signature does not verify"):
        verify_policy(forged, "eu", admins)
    with pytest.raises(PolicyError, match="written for site 'eu'"):
        verify_policy(good, "us", admins)
    edited = good.model_copy(update={"policy": policy.model_copy(update={"version": 9})})
    with pytest.raises(PolicyError, match="signature does not verify"):
        verify_policy(edited, "eu", admins)


def test_cedar_is_validated_against_the_schema() -> None:
    check_cedar(DEFAULT_CEDAR)
    with pytest.raises(PolicyError, match="roundz"):
        check_cedar('permit (principal, action, resource) when { context.roundz < 5 };')
    with pytest.raises(PolicyError, match="parse"):
        check_cedar("permit (principal, action")


@pytest.mark.parametrize("rule", DATASET_RULES, ids=lambda r: r.dataset)
def test_each_dataset_rule_admits_the_reviewed_strategies_aggregators_and_its_models_only(
        policy: SitePolicy, keys: Path, rule: DatasetRule) -> None:
    others = {m for r in DATASET_RULES for m in r.models} - set(rule.models)
    cases = [*((k, v, True) for k, names in [("strategy", REVIEWED_STRATEGIES), ("aggregator", REVIEWED_AGGREGATORS),
                                            ("model", rule.models), ("rounds", (MAX_ROUNDS,))] for v in names),
             ("strategy", "tp", False), ("aggregator", "krum", False), ("rounds", MAX_ROUNDS + 1, False),
             *(("model", m, False) for m in others)]
    request = signed(keys, dataset=rule.dataset, purpose=rule.purpose)
    for key, value, admitted in cases:
        d = run(policy, request, dataset=rule.dataset, context={**CTX, "model": rule.models[0], key: value})
        assert d.allowed == admitted, (key, value, d.reason)
        assert d.rule == (rule.rule_id if admitted else "default-deny")


def test_the_default_policy_names_only_what_the_registries_know() -> None:
    """A misspelt name in a Cedar set never matches, silently: each reviewed name must exist."""
    from insitu.federated.aggregators import AGGREGATORS
    from insitu.models import MODELS
    from insitu.parallel.strategies import strategies

    assert set(REVIEWED_AGGREGATORS) <= set(AGGREGATORS)
    assert set(REVIEWED_STRATEGIES) <= set(strategies())
    assert all(m in MODELS or ":" in m for r in DATASET_RULES for m in r.models)  # built in, or module:factory
    assert all(f'"{name}"' in DEFAULT_CEDAR for name in (*REVIEWED_AGGREGATORS, *REVIEWED_STRATEGIES))


def test_a_request_round_trips_as_a_flow_parameter(keys: Path) -> None:
    req = signed(keys)
    assert parse_signed(req).verifies_with(pub(keys, "alice"))
    assert parse_signed(__import__("json").dumps(req)).request.principal == "alice"


def test_a_job_id_belongs_to_the_request_that_first_ran_it(policy: SitePolicy, keys: Path) -> None:
    from insitu.governance.policy import job_owner_refusal

    first = {"job_id": "job-1", "training": "fraud", "standing": False, "principal": "alice"}
    approval = signed(keys, job_id=None, override_bounds={"rounds": {"min": 1, "max": 10}})
    d = job_owner_refusal(run(policy, approval), first, "fraud")
    assert not d.allowed and d.rule == "request.job-owner" and "standing approval may not" in d.reason
    d = job_owner_refusal(run(policy, signed(keys)), {**first, "training": "other"}, "fraud")
    assert not d.allowed and "first admitted here for training 'other'" in d.reason
    assert job_owner_refusal(run(policy, signed(keys)), first, "fraud").allowed  # a resumed job
    assert job_owner_refusal(run(policy, approval), None, "fraud").allowed  # the first time


def test_both_federation_modes_are_admitted_by_default_and_a_site_may_refuse_async(policy: SitePolicy,
                                                                                   keys: Path) -> None:
    assert run(policy, signed(keys), context={**CTX, "federation": "async"}).allowed
    assert run(policy, signed(keys), context={**CTX, "federation": "sync"}).allowed
    cedar = policy.cedar + '\n@id("sync-rounds-only")\nforbid (principal, action, resource) ' \
        'when { context.federation == "async" };'
    strict = policy.model_copy(update={"cedar": cedar})
    d = run(strict, signed(keys), context={**CTX, "federation": "async"})
    assert not d.allowed and d.rule == "sync-rounds-only", d.reason
    assert run(strict, signed(keys), context={**CTX, "federation": "sync"}).allowed
    assert run(strict, signed(keys)).allowed  # a context without the attribute is a sync job's


def test_the_job_context_carries_the_federation_mode() -> None:
    from insitu.conf import TrainingConfig
    from insitu.governance.policy import job_context

    assert job_context(TrainingConfig())["federation"] == "sync"
    t = TrainingConfig.model_validate({"federation": {"mode": "async"}, "validation": {"select": "last"}})
    assert job_context(t)["federation"] == "async"


def test_a_refusal_names_every_attribute_the_policy_decided_on(policy: SitePolicy, keys: Path) -> None:
    """A user's own model the policy does not list is refused, and the message says which model (and every other
    attribute), so the refusal can be read without the policy at hand."""
    d = run(policy, signed(keys), context={**CTX, "model": "mypkg.nets:make_net"})
    assert not d.allowed
    for key in ("purpose", "training", "standing", "strategy", "aggregator", "task", "model", "rounds",
                "local_epochs", "ranks_per_site", "federation"):
        assert f"{key} " in d.reason, key
    assert "'mypkg.nets:make_net'" in d.reason and "roles ['data-scientist']" in d.reason


def test_a_policy_signed_before_shard_limits_existed_still_verifies_and_cannot_be_widened(policy: SitePolicy,
                                                                                        keys: Path) -> None:
    """Policies signed when ``limits`` held only the row floor verify as they were signed; changing a shard
    limit of such a policy breaks its signature."""
    from insitu.governance.policy import SignedPolicy
    from insitu.governance.principals import sign

    admins = {"eu-admin": pub(keys, "eu-admin")}
    old_body = {**policy.model_dump(mode="json"), "limits": {"min_rows_per_aggregate": 20}}
    old = SignedPolicy(policy=policy, signer="eu-admin", signature=sign(load_private_key(keys / "eu-admin.key"),
                                                                        old_body))
    loaded = SignedPolicy.model_validate_json(old.model_dump_json())
    assert verify_policy(loaded, "eu", admins) == policy
    widened = loaded.model_copy(update={"policy": policy.model_copy(
        update={"limits": policy.limits.model_copy(update={"max_columns": 5})})})
    with pytest.raises(PolicyError, match="signature does not verify"):
        verify_policy(widened, "eu", admins)

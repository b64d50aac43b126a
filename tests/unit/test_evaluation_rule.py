"""The rule evaluate.one-selected-round (insitu.governance.evaluation): which models a site scores on its test
rows."""

from __future__ import annotations

from insitu.governance.evaluation import evaluation_refusal, scored_global_model


def test_a_validated_round_and_the_champion_are_scored() -> None:
    assert evaluation_refusal(["round-0002", "champion"], 3, [0, 1, 2, 3], None) is None
    assert evaluation_refusal(["round-0002"], 3, [2], None) is None
    assert scored_global_model(["champion", "round-0002"]) == "round-0002"


def test_exactly_one_global_model_without_repeats() -> None:
    one = "a job's evaluation scores exactly one global model of the job (and at most the champion)"
    assert evaluation_refusal([], 3, [0], None) == one
    assert evaluation_refusal(["champion"], 3, [0], None) == one
    assert evaluation_refusal(["round-0001", "round-0002"], 3, [1, 2], None) == one
    assert evaluation_refusal(["round-0001", "champion", "champion"], 3, [1], None) == one
    assert scored_global_model(["round-0001", "round-0002"]) is None


def test_only_the_jobs_own_rounds() -> None:
    assert evaluation_refusal(["round-0004"], 3, [0, 1, 2, 3], None) == \
        "'round-0004' is not a global model of this job (rounds 0 to 3)"
    assert evaluation_refusal(["x" * 60], 3, [0], None) == f"{'x' * 40!r} is not a global model of this job " \
        "(rounds 0 to 3)"


def test_only_a_round_this_site_validated() -> None:
    assert evaluation_refusal(["round-0001"], 5, [2, 3, 4, 5], None) == \
        "this site did not validate round-0001 during the job (it validated rounds [2, 3, 4]…)"


def test_without_validations_only_the_last_round() -> None:
    assert evaluation_refusal(["round-0003"], 3, [], None) is None
    assert evaluation_refusal(["round-0002"], 3, [], None) == \
        "this site has no validation of the job's rounds, so only the last one, round-0003"


def test_the_first_scored_round_binds_the_job() -> None:
    assert evaluation_refusal(["round-0002", "champion"], 3, [1, 2], "round-0002") is None
    assert evaluation_refusal(["round-0001"], 3, [1, 2], "round-0002") == \
        "this job's evaluation is bound to round-0002 (scored first), not round-0001"

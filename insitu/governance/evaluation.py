"""Which models a site scores on its test rows: the rule ``evaluate.one-selected-round``, as a pure decision.

A coordinator may not use a site's test rows as an oracle for weights of its choosing. So a site scores, per
job, one global model and the champion: a round of the job that this site validated itself (it published that
round's validation, so the round's model came out of this job's training), or the last round when it has no
validation rows. The first round it scores is bound to the job in the site's own store; any other round is
refused afterwards.

A site's evaluation (``tasks/site_evaluation.py``: in its one run of the job, or in a ``site-evaluate`` run) gathers
the facts (the rounds this site validated, the model the job is bound to), asks :func:`evaluation_refusal`, binds
the job on its first evaluation, and audits a refusal.
"""

from __future__ import annotations

from collections.abc import Collection

from insitu.federated.paths import CHAMPION, round_name

RULE = "evaluate.one-selected-round"


def scored_global_model(weights: list[str]) -> str | None:
    """The one global model among the models a site is asked to score (the rest is the champion), or None."""
    models = [w for w in weights if w != CHAMPION.name]
    return models[0] if len(models) == 1 else None


def evaluation_refusal(weights: list[str], rounds: int, validated: Collection[int], bound: str | None) -> str | None:
    """Why a site will not score ``weights`` on its test rows (None: it will).

    Parameters
    ----------
    weights
        The models the coordinator asks the site to score (global models' names and the champion's).
    rounds
        The job's rounds: its global models are rounds 0 to ``rounds``.
    validated
        The rounds whose validation this site published during the job.
    bound
        The global model this job's evaluation is bound to in the site's own store (None before the first).
    """
    name = scored_global_model(weights)
    if not weights or name is None or len(weights) != len(set(weights)):
        return "a job's evaluation scores exactly one global model of the job (and at most the champion)"
    known = {round_name(r): r for r in range(rounds + 1)}
    if name not in known:
        return f"{name[:40]!r} is not a global model of this job (rounds 0 to {rounds})"
    done = sorted(validated)
    if done and known[name] not in done:
        return f"this site did not validate {name} during the job (it validated rounds {done[:3]}…)"
    if not done and known[name] != rounds:
        return f"this site has no validation of the job's rounds, so only the last one, {round_name(rounds)}"
    if bound is not None and bound != name:
        return f"this job's evaluation is bound to {bound} (scored first), not {name}"
    return None

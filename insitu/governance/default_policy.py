"""The Cedar rules a site of the local platform starts with (:data:`DEFAULT_CEDAR`), built from one list each.

Data scientists may prepare, train and evaluate each shipped example's dataset for its purpose, with the
in-site strategies and aggregators this site has reviewed, for at most :data:`MAX_ROUNDS` rounds; a standing
approval (Prefect UI, schedules) may not run more than :data:`MAX_STANDING_ROUNDS`. The reviewed names are
listed once here and every dataset's rule admits exactly those. They are the site's decision, not the
registries': a new aggregator is not admitted until a site reviews it and adds it here (or to its own policy).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

ROLE = "data-scientist"
ACTIONS = ("prepare", "train", "evaluate")
REVIEWED_STRATEGIES = ("single", "ddp", "fsdp", "pipeline", "hybrid")
REVIEWED_AGGREGATORS = ("fedavg", "fedprox", "fedadam", "fedyogi", "fedadagrad", "median", "trimmed_mean")
MAX_ROUNDS = 50
MAX_STANDING_ROUNDS = 20


@dataclass(frozen=True)
class DatasetRule:
    """One shipped example's permit: what differs between the examples (the rest is the reviewed lists)."""

    rule_id: str
    comment: tuple[str, ...]  # the rule's ``//`` lines
    dataset: str
    purpose: str
    models: tuple[str, ...]


DATASET_RULES = (
    DatasetRule("data-scientists-fraud-detection",
                ("Data scientists may prepare, train and evaluate on the fraud dataset for fraud detection,",
                 f"with the strategies and aggregators this site has reviewed, for at most {MAX_ROUNDS} rounds."),
                "fraud", "fraud-detection", ("tabular_mlp", "fraud_mlp")),
    DatasetRule("data-scientists-digits",
                ("The shipped multi-class example (handwritten digits), under the same reviewed code.",),
                "digits", "digit-recognition", ("tabular_mlp", "examples.models:residual_mlp")),
    DatasetRule("data-scientists-card-sequences",
                ("The sequence example: a transformer over each card's recent transactions, for the same purpose.",),
                "card_sequences", "fraud-detection", ("sequence_transformer", "tabular_mlp")),
)


def cedar_set(names: Iterable[str]) -> str:
    """A Cedar set literal of strings: ``["a", "b"]``."""
    return "[" + ", ".join(f'"{n}"' for n in names) + "]"


def permit(rule: DatasetRule) -> str:
    """The Cedar ``permit`` of one dataset rule."""
    actions = ", ".join(f'Insitu::Action::"{a}"' for a in ACTIONS)
    return "\n".join([
        *(f"// {line}" for line in rule.comment),
        f'@id("{rule.rule_id}")',
        "permit (",
        f'  principal in Insitu::Role::"{ROLE}",',
        f"  action in [{actions}],",
        f'  resource == Insitu::Dataset::"{rule.dataset}"',
        ")",
        "when {",
        f'  context.purpose == "{rule.purpose}" &&',
        f"  {cedar_set(REVIEWED_STRATEGIES)}.contains(context.strategy) &&",
        f"  {cedar_set(REVIEWED_AGGREGATORS)}.contains(context.aggregator) &&",
        f"  {cedar_set(rule.models)}.contains(context.model) &&",
        f"  context.rounds <= {MAX_ROUNDS}",
        "};",
    ])


STANDING_LIMIT = f"""\
// A standing approval (Prefect UI, schedules) may not run long jobs.
@id("standing-approvals-at-most-{MAX_STANDING_ROUNDS}-rounds")
forbid (principal, action, resource)
when {{ context.standing && context.rounds > {MAX_STANDING_ROUNDS} }};"""

DEFAULT_CEDAR = "\n\n".join([*(permit(r) for r in DATASET_RULES), STANDING_LIMIT]) + "\n"

"""The exchange protocol's vocabulary: kinds, who writes them, the row floor and the byte budgets.

Everything here is a constant or a pure function, so that the site (before writing) and the coordinator
(after reading) apply the very same rules. The schemas of each artefact are in
:mod:`insitu.federated.schemas`, the checks of model states in :mod:`insitu.federated.states`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

KINDS = ("plan", "stats", "weights", "update", "metrics", "summary", "control")
COORDINATOR = "coordinator"

# The row floor of every published aggregate: a sum, a metric or a histogram bin over fewer rows than this
# describes individual rows. A site's own policy may ask for more, never for less.
MIN_ROWS = 20

KIB = 1024
MIB = 1024 * KIB

# Bytes one site may have on the exchange per kind in one job. A site writes one prepare.json and one
# evaluate.json: these budgets are far above what they need (a few KiB) and far below a table's worth.
SITE_BUDGETS: Mapping[str, int] = {"stats": 64 * KIB, "metrics": 256 * KIB}
# An update has the global model's layout, so its file is about the global's size; twice that leaves room
# for serialisation differences, not for a second payload.
UPDATE_BYTES_FACTOR = 2
MAX_MANIFEST_BYTES = 16 * KIB
MAX_STATE_BYTES = 256 * MIB  # a bound on any one state file, before it is even read

# The default bound on ||update - global||_2 over all floating-point tensors (parameters and buffers).
# Measured on the shipped fraud MLP (4,157 values, synthetic data, one site): the shipped config (1 epoch, lr
# 0.003) moves it by about 3; 20 epochs of batch 32 (the resume test) by about 9; 100 epochs of batch 32 at lr
# 0.01 by about 49. 100 leaves room for heavy local training, while a state carrying raw values (amounts, ids)
# instead of trained weights, or a scaled "boosted" update, lands orders of magnitude above. An absolute bound
# (not one relative to the global norm) so that a site cannot raise it by inflating the model over rounds.
MAX_UPDATE_NORM = 100.0


class ExchangeError(RuntimeError):
    """An artefact is missing, corrupt, or not allowed on the exchange."""


class ProtocolViolation(ExchangeError):
    """A writer broke the protocol as a whole (over its byte budget, objects outside the protocol): the job stops."""


_SHOWABLE = re.compile(r"^[A-Za-z0-9_.-]{1,48}$")


def shown(text: object, quote: bool = True) -> str:
    """``text`` (quoted) for an error message if it looks like an identifier; otherwise only its length.

    Keys, names and kinds in what a site wrote are the site's choice: one of them may be a row (a card
    number as a key), and error messages end up in the coordinator's logs.
    """
    s = str(text)
    if not _SHOWABLE.match(s):
        return f"<{len(s)} characters>"
    return repr(s) if quote else s


# One round's validation document (a model's metrics on a site's validation split; no histograms).
VALIDATION_BYTES = 64 * KIB


def site_budgets(rounds: int, model_bytes: int, updates: int | None = None) -> dict[str, int]:
    """Per kind, the bytes one site may have on the exchange once ``rounds`` rounds were trained.

    ``model_bytes`` is the size of the global model's state file; ``updates`` the number of updates a site
    may publish (default: one per round; an async job's is :func:`async_update_limit`). Kinds not named here
    (plan, weights, summary, control, anything else) are the coordinator's alone: a site's budget for them is 0.
    """
    per_update = UPDATE_BYTES_FACTOR * model_bytes + MAX_MANIFEST_BYTES
    # Metrics: the evaluation, plus one validation per global model (rounds 0 … rounds).
    metrics = SITE_BUDGETS["metrics"] + (max(rounds, 0) + 1) * VALIDATION_BYTES
    n = max(rounds, 0) if updates is None else max(updates, 0)
    return {**SITE_BUDGETS, "metrics": metrics, "update": n * per_update}


def async_update_limit(versions: int, buffer_size: int = 1) -> int:
    """How many updates one site may push in an async job of ``versions`` global versions.

    Every version takes ``buffer_size`` accepted updates (FedAsync: 1), so a site that alone made the whole job
    pushes that many; twice as many, plus two, leaves room for refused and in-flight ones. A site stops
    pushing at this limit (it knows it from its own copy of the config) and the coordinator budgets the same.
    """
    return 2 * max(versions, 1) * max(buffer_size, 1) + 2


def check_budgets(ledger: Mapping[str, Mapping[str, int]], budgets: Mapping[str, int]) -> list[str]:
    """Every (site writer, kind) whose bytes in ``ledger`` exceed ``budgets``; empty when all are within.

    ``ledger`` is :meth:`Exchange.ledger` (bytes per writer and kind). The coordinator's own prefix is not
    budgeted: it is the party doing the checking, and it never holds rows.
    """
    problems = []
    for writer, kinds in sorted(ledger.items()):
        if writer == COORDINATOR:
            continue
        for kind, n in sorted(kinds.items()):
            limit = budgets.get(kind, 0)
            if n > limit:
                what = f"its budget is {limit:,}" if limit else "sites may not write that kind"
                problems.append(f"{shown(writer)} has {n:,} bytes of {shown(kind)} on the exchange; {what}")
    return problems

"""Synthetic card-transaction *sequences*, different per site (non-IID), fully determined by a seed.

The data path is tabular, so a sequence travels as one row per transaction holding the card's last
:data:`SEQ_LEN` transactions, step-major: the columns of step ``t = 0`` (the oldest) come first, step
``L - 1`` (the current transaction) last, and every step has the same columns in the same order
(:data:`STEP_COLUMNS`). A model reshapes the featurized ``(batch, L * k)`` matrix into ``(batch, L, k)``;
:func:`step_features` finds ``k`` from a schema and checks that layout.

The generative story, per site (the site's profile of :mod:`insitu.data.synthetic`: amount scale, category
mix, country mix, fraud rate):

1. **Cards.** Each card has its own typical amount (log-normal around the site's scale, so one card's
   usual purchase is another's outlier), its own category preferences (a Dirichlet draw around the site's
   mix), its own usual hours (the day's curve shifted by up to two hours), its own share of online
   purchases, and a history of ``L - 1 + m`` transactions (``m`` at least 1): one row is emitted for each of
   the last ``m``, the first ``L - 1`` being history only.
2. **Legitimate noise that looks like fraud in a single row.** Now and then a card makes one large
   purchase (an appliance, a flight), shops online, buys at night, and some cards travel: a run of foreign
   transactions at otherwise normal amounts, hours and categories.
3. **Compromise.** A site-dependent share of cards is compromised once, at a point of its emitted
   history, and then shows a *burst* of 2–6 fraudulent transactions in a row (a site-dependent mean
   length), each well above the card's own typical amount (about 3.7 times its median), often foreign and
   online (35–65 %, site-dependent), often at unusual hours (00–05) and mostly in risky categories
   (electronics, online, gambling, travel). Every transaction of the burst is labelled ``is_fraud``; a burst
   that starts near the card's last transaction is cut short.

So the label depends on the sequence: whether an amount is large is relative to the card's own earlier
amounts, and from the second transaction of a burst on, the earlier steps are anomalous too. A model that
sees only the current transaction confuses bursts with travel and one-off large purchases, and cannot tell
a big-spending card's normal purchase from a modest card's fraud. The compromise share is calibrated so
that the rows' fraud rate is about the site profile's (eu 2 %, us 4.5 %, apac 3 %).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from insitu.conf import SchemaConfig
from insitu.data.features import feature_names
from insitu.data.synthetic import CATEGORIES, _hour_weights, profile

SEQ_LEN = 8  # L: transactions per row, the current one last
ID_COLUMN = "transaction_id"
LABEL_COLUMN = "is_fraud"
# The columns of one step, in this order; step t's are named f"{name}_t{t}".
STEP_COLUMNS = ("amount", "hour", "foreign", "online", "merchant_category")
RISKY = {"electronics": 3.0, "online": 3.0, "gambling": 2.0, "travel": 1.5}  # what fraudsters buy, relative weight
MAX_AMOUNT = 1_000_000.0


@dataclass(frozen=True)
class BurstProfile:
    """How compromises look at one site (the card behaviour comes from the site's :class:`SiteProfile`)."""

    mean_burst: float  # mean number of fraudulent transactions in a row
    foreign: float  # share of fraudulent transactions that are foreign
    online: float  # share that are card-not-present


BURSTS = {
    "eu": BurstProfile(3.0, 0.50, 0.50),
    "us": BurstProfile(4.0, 0.35, 0.65),
    "apac": BurstProfile(3.5, 0.45, 0.55),
}
DEFAULT_BURST = BurstProfile(3.5, 0.45, 0.55)
BURST_MIN, BURST_MAX = 2, 6  # fraudulent transactions in a row
MEAN_EMITTED = 24.0  # mean emitted rows per card (m = 1 + Poisson(MEAN_EMITTED - 1))


def step_columns(t: int) -> list[str]:
    """The column names of step ``t`` (0 is the oldest, ``SEQ_LEN - 1`` the current transaction)."""
    return [f"{name}_t{t}" for name in STEP_COLUMNS]


def columns(seq_len: int = SEQ_LEN) -> list[str]:
    """Every column of a generated frame, in order: the id, the steps (step-major), the label."""
    return [ID_COLUMN, *(c for t in range(seq_len) for c in step_columns(t)), LABEL_COLUMN]


def generate(site: str, rows: int, seed: int, shard: int = 0) -> pd.DataFrame:
    """``rows`` clean rows for one shard of one site (see the module's story); identical inputs, identical rows.

    Cards are simulated until they have emitted ``rows`` rows (the last card's history is cut short).
    A row's id is ``<site>-<shard>-<card>-<position>``, unique across a site's shards.
    """
    L = SEQ_LEN
    p, b = profile(site), BURSTS.get(site, DEFAULT_BURST)
    rng = np.random.default_rng([seed, zlib.crc32(site.encode()), shard, 0x5E0])
    if rows <= 0:
        return _frame(site, shard, np.zeros((0, L)), np.zeros((0, L), np.int64), np.zeros((0, L), bool),
                      np.zeros((0, L), bool), np.zeros((0, L), np.int64), np.zeros(0, bool), np.zeros(0, np.int64),
                      np.zeros(0, np.int64))

    # --- cards and how many rows each emits
    n_cards = int(rows / MEAN_EMITTED * 1.3) + 8
    emitted = 1 + rng.poisson(MEAN_EMITTED - 1, n_cards)
    while emitted.sum() < rows:  # rare: draw more cards
        emitted = np.concatenate([emitted, 1 + rng.poisson(MEAN_EMITTED - 1, n_cards)])
    n_cards = int(np.searchsorted(np.cumsum(emitted), rows) + 1)
    emitted = emitted[:n_cards].copy()
    emitted[-1] -= int(emitted.sum() - rows)
    length = emitted + (L - 1)  # transactions per card
    card = np.repeat(np.arange(n_cards), length)  # card of each transaction
    start = np.concatenate([[0], np.cumsum(length)[:-1]])
    pos = np.arange(len(card)) - start[card]  # position within the card's history
    n = len(card)

    # --- each card's habits
    card_mu = np.log(p.amount_scale) + rng.normal(0.0, 1.0, n_cards)
    weights = np.array(p.category_weights) / sum(p.category_weights)
    card_cat = rng.dirichlet(weights * 12.0 + 0.05, n_cards)
    card_shift = rng.integers(-2, 3, n_cards)
    card_online = rng.beta(2.0, 5.0, n_cards)
    card_foreign = rng.beta(1.0, 40.0, n_cards)

    # --- legitimate transactions
    amount = np.exp(card_mu[card] + rng.normal(0.0, 0.45, n))
    big = rng.random(n) < 0.04  # one-off large purchases
    amount[big] *= np.exp(rng.normal(1.5, 0.5, big.sum()))
    hour = (rng.choice(24, size=n, p=_hour_weights()) + card_shift[card]) % 24
    night = rng.random(n) < 0.06
    hour[night] = rng.integers(0, 6, night.sum())
    cat_idx = _choose_rows(rng, card_cat[card])
    foreign = rng.random(n) < card_foreign[card]
    # Trips: some cards spend a run of transactions abroad, otherwise as usual.
    trip = _runs(rng, start, length, L - 1, rng.random(n_cards) < 0.40, 8.0, 3)
    foreign |= trip & (rng.random(n) < 0.9)
    online = rng.random(n) < card_online[card]

    # --- compromises: a burst of fraud from a point of the emitted history on
    rate = _compromise_rate(p.fraud_rate, b.mean_burst, emitted, BURST_MIN, BURST_MAX)
    fraud = _runs(rng, start, length, L - 1, rng.random(n_cards) < rate, b.mean_burst, BURST_MIN, BURST_MAX)
    k = int(fraud.sum())
    amount[fraud] = np.exp(card_mu[card[fraud]] + rng.normal(1.3, 0.5, k))
    odd = rng.random(k) < 0.40
    hour[np.flatnonzero(fraud)[odd]] = rng.integers(0, 6, odd.sum())
    risky = np.array([RISKY.get(c, 0.3) for c in CATEGORIES])
    shop = np.flatnonzero(fraud)[rng.random(k) < 0.6]  # the rest look like the card's own shopping
    cat_idx[shop] = rng.choice(len(CATEGORIES), size=len(shop), p=risky / risky.sum())
    foreign[fraud] = rng.random(k) < b.foreign
    online[fraud] = rng.random(k) < b.online
    online |= np.asarray(CATEGORIES)[cat_idx] == "online"
    amount = np.clip(np.round(amount, 2), 0.01, MAX_AMOUNT)

    # --- one row per transaction with L - 1 predecessors: gather the window, step-major
    current = np.flatnonzero(pos >= L - 1)
    window = current[:, None] + np.arange(-(L - 1), 1)[None, :]  # (rows, L) transaction indices, oldest first
    return _frame(site, shard, amount[window], hour[window], foreign[window], online[window], cat_idx[window],
                  fraud[current], card[current], pos[current])


def _frame(site: str, shard: int, amount: np.ndarray, hour: np.ndarray, foreign: np.ndarray, online: np.ndarray,
           cat_idx: np.ndarray, fraud: np.ndarray, card: np.ndarray, pos: np.ndarray) -> pd.DataFrame:
    cats = np.asarray(CATEGORIES, dtype=object)
    ids = [f"{site}-{shard:03d}-{c:06d}-{i:05d}" for c, i in zip(card, pos, strict=True)]
    data: dict[str, object] = {ID_COLUMN: ids}
    for t in range(SEQ_LEN):
        data[f"amount_t{t}"] = amount[:, t].astype("float64")
        data[f"hour_t{t}"] = hour[:, t].astype("int64")
        data[f"foreign_t{t}"] = foreign[:, t].astype(bool)
        data[f"online_t{t}"] = online[:, t].astype(bool)
        data[f"merchant_category_t{t}"] = cats[cat_idx[:, t]]
    data[LABEL_COLUMN] = fraud.astype(bool)
    return pd.DataFrame(data)


def _choose_rows(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One category index per row of ``probs`` (rows sum to 1), vectorised inverse-CDF sampling."""
    cdf = np.cumsum(probs, axis=1)
    u = rng.random(len(probs)) * cdf[:, -1]
    return np.minimum((cdf < u[:, None]).sum(axis=1), probs.shape[1] - 1)


def _runs(rng: np.random.Generator, start: np.ndarray, length: np.ndarray, first: int, which: np.ndarray,
          mean: float, min_len: int, max_len: int | None = None) -> np.ndarray:
    """A mask over all transactions: for each card in ``which``, one run of consecutive transactions beginning
    at a uniform position ``>= first`` of its history, ``min_len + Poisson(mean - min_len)`` long (at most
    ``max_len``), cut at the card's end."""
    mask = np.zeros(int(length.sum()), dtype=bool)
    cards = np.flatnonzero(which)
    begin = first + (rng.random(len(cards)) * (length[cards] - first)).astype(np.int64)
    run = min_len + rng.poisson(max(mean - min_len, 0.0), len(cards))
    if max_len is not None:
        run = np.minimum(run, max_len)
    end = np.minimum(begin + run, length[cards])
    for c, s, e in zip(cards, begin, end, strict=True):
        mask[start[c] + s : start[c] + e] = True
    return mask


def _compromise_rate(fraud_rate: float, mean_burst: float, emitted: np.ndarray, min_len: int = 2,
                     max_len: int = 6) -> float:
    """The share of cards to compromise so that, in expectation, ``fraud_rate`` of the emitted rows are fraud.

    A burst of ``r`` starting uniformly in a card's ``m`` emitted rows keeps ``sum(min(r, j) for j in 1..m) / m``
    of them (it is cut at the card's end); averaged over the burst lengths' distribution and the cards.
    """
    lam = max(mean_burst - min_len, 0.0)
    j = np.arange(max_len - min_len + 1)
    pmf = np.exp(-lam) * lam**j / np.array([math.factorial(int(i)) for i in j])
    pmf[-1] += 1.0 - pmf.sum()  # longer draws are capped at max_len
    r = (min_len + j)[None, :].astype(np.float64)
    m = emitted.astype(np.float64)[:, None]
    kept = np.where(r >= m, (m + 1) / 2, (r * (r + 1) / 2 + r * (m - r)) / m)  # (cards, lengths)
    per_card = (kept * pmf[None, :]).sum(axis=1)
    return float(np.clip(fraud_rate * emitted.sum() / per_card.sum(), 0.0, 1.0))


def step_features(schema: SchemaConfig, seq_len: int = SEQ_LEN) -> int:
    """``k``, the features per step, of a step-major sequence schema (a model reads ``(batch, L, k)``).

    Checks that :func:`insitu.data.features.feature_names` is ``seq_len`` blocks of equal length whose names
    are identical up to the ``_t{t}`` suffix of their column (``amount_t3``, ``merchant_category_t3=fuel``).

    Raises
    ------
    ValueError
        When the features do not split into such blocks; the message names the first mismatch.
    """
    names = feature_names(schema)
    if not names or len(names) % seq_len:
        raise ValueError(f"the schema has {len(names)} features, not a multiple of {seq_len} steps: a sequence "
                         f"schema holds {seq_len} blocks of the same columns, step-major")
    k = len(names) // seq_len
    base = [_strip(n, 0) for n in names[:k]]
    for i, name in enumerate(names):
        t, j = divmod(i, k)
        got = _strip(name, t)
        if got is None or got != base[j]:
            b = base[j]
            expected = f"{b[0]}_t{t}{b[1]}" if b is not None else f"a column ending in _t{t}"
            raise ValueError(f"feature {i} is {name!r} but step {t} (features {t * k}–{t * k + k - 1}) must repeat "
                             f"step 0's features in the same order: expected {expected!r}; list every step's "
                             f"columns in the same order, steps from _t0 to _t{seq_len - 1}")
    return k


def _strip(feature: str, t: int) -> tuple[str, str] | None:
    """``("amount", "")`` for ``amount_t3`` at step 3, ``("merchant_category", "=fuel")`` for a one-hot
    feature; None when the column does not end in ``_t{t}``."""
    column, eq, value = feature.partition("=")
    suffix = f"_t{t}"
    if not column.endswith(suffix) or len(column) == len(suffix):
        return None
    return column[: -len(suffix)], eq + value


def check_matches_schema(schema: SchemaConfig) -> None:
    """The generator writes the schema's columns in the schema's order (step-major); fail early otherwise."""
    step_features(schema)  # first: its message names the first feature out of place
    expected = columns()
    if list(schema.columns) != expected:
        raise ValueError(f"the sequence generator writes columns {expected} but the dataset schema declares "
                         f"{list(schema.columns)}; seed the card_sequences dataset or adapt "
                         "insitu/data/sequences.py")

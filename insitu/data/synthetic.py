"""Synthetic card-transaction fraud data, different per site (non-IID), fully determined by a seed.

Each site has its own fraud rate, amount scale, category and country mix. A small fraction of rows
is malformed on purpose (negative amounts, unknown categories, impossible hours, missing values) so
that the quarantine path runs in every demo.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from insitu.conf import SchemaConfig

CATEGORIES = ["grocery", "fuel", "travel", "electronics", "restaurants", "online", "pharmacy", "gambling"]
RISK = {"grocery": -0.6, "fuel": -0.2, "travel": 0.6, "electronics": 0.9, "restaurants": -0.4,
        "online": 0.7, "pharmacy": -0.5, "gambling": 1.4}
DEVICES = ["chip", "contactless", "online", "swipe"]
DEVICE_RISK = {"chip": -0.8, "contactless": -0.3, "online": 0.9, "swipe": 0.6}


@dataclass(frozen=True)
class SiteProfile:
    fraud_rate: float
    amount_scale: float
    countries: tuple[str, ...]
    category_weights: tuple[float, ...]


PROFILES = {
    "eu": SiteProfile(0.020, 55.0, ("DE", "FR", "ES", "IT", "NL"), (0.30, 0.12, 0.08, 0.08, 0.18, 0.16, 0.06, 0.02)),
    "us": SiteProfile(0.045, 95.0, ("US", "CA", "MX"), (0.20, 0.15, 0.10, 0.14, 0.14, 0.20, 0.03, 0.04)),
    "apac": SiteProfile(0.030, 35.0, ("JP", "SG", "AU", "IN"), (0.25, 0.08, 0.14, 0.16, 0.20, 0.12, 0.03, 0.02)),
}


def profile(site: str) -> SiteProfile:
    """The site's profile; unknown sites get one derived from their name."""
    if site in PROFILES:
        return PROFILES[site]
    r = np.random.default_rng(zlib.crc32(site.encode()))
    w = r.dirichlet(np.ones(len(CATEGORIES)))
    return SiteProfile(float(r.uniform(0.01, 0.05)), float(r.uniform(30, 120)), ("OTHER",), tuple(w.tolist()))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def generate(site: str, rows: int, seed: int, shard: int = 0) -> pd.DataFrame:
    """Clean rows for one shard of one site."""
    p = profile(site)
    rng = np.random.default_rng([seed, zlib.crc32(site.encode()), shard])
    cat = rng.choice(CATEGORIES, size=rows, p=np.array(p.category_weights) / sum(p.category_weights))
    device = rng.choice(DEVICES, size=rows, p=[0.45, 0.30, 0.18, 0.07])
    foreign = rng.random(rows) < 0.08
    country = np.where(foreign, "OTHER", rng.choice(list(p.countries), size=rows))
    amount = np.round(rng.lognormal(np.log(p.amount_scale), 0.9, rows), 2)
    hour = rng.choice(24, size=rows, p=_hour_weights())
    card_age = np.round(rng.gamma(2.0, 400.0, rows), 1)
    velocity = rng.poisson(2.0, rows)
    z = (
        0.9 * (np.log1p(amount) - np.log1p(p.amount_scale))
        + np.vectorize(RISK.get)(cat)
        + np.vectorize(DEVICE_RISK.get)(device)
        + 1.1 * ((hour <= 4) | (hour == 23))
        - 0.9 * np.log1p(card_age / 100.0)
        + 0.35 * velocity
        + 1.2 * foreign
    )
    intercept = _calibrate(z, p.fraud_rate)
    fraud = rng.random(rows) < _sigmoid(z + intercept)
    ids = [f"{site}-{shard:03d}-{i:08d}" for i in range(rows)]
    return pd.DataFrame(
        {
            "transaction_id": ids,
            "amount": amount,
            "merchant_category": cat,
            "country": country,
            "hour": hour.astype("int64"),
            "device": device,
            "card_age_days": card_age,
            "txn_last_24h": velocity.astype("int64"),
            "foreign": foreign,
            "is_fraud": fraud,
        }
    )


def _hour_weights() -> np.ndarray:
    w = np.array([1, 0.6, 0.4, 0.3, 0.3, 0.5, 1, 2, 3, 3.5, 3.5, 4, 4.5, 4, 3.5, 3.5, 4, 4.5, 5, 4.5, 4, 3, 2, 1.5])
    return w / w.sum()


def _calibrate(z: np.ndarray, rate: float) -> float:
    """Intercept that makes the mean fraud probability equal ``rate`` (bisection)."""
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if _sigmoid(z + mid).mean() > rate:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def inject_malformed(df: pd.DataFrame, fraction: float, seed: int) -> tuple[pd.DataFrame, int]:
    """Corrupt about ``fraction`` of the rows in ways the schema rejects; returns (frame, count)."""
    rng = np.random.default_rng(seed)
    n = max(1, int(len(df) * fraction))
    idx = rng.choice(len(df), size=n, replace=False)
    out = df.astype({"hour": "float64", "card_age_days": "float64"}).astype({"merchant_category": object})
    kinds = ["negative_amount", "unknown_category", "bad_hour", "missing_card_age"]
    for j, i in enumerate(idx):
        kind = kinds[j % len(kinds)]
        if kind == "negative_amount":
            out.loc[i, "amount"] = -abs(out.loc[i, "amount"]) - 1
        elif kind == "unknown_category":
            out.loc[i, "merchant_category"] = "crypto_atm"
        elif kind == "bad_hour":
            out.loc[i, "hour"] = 31.0
        else:
            out.loc[i, "card_age_days"] = np.nan
    return out, n


def check_matches_schema(schema: SchemaConfig) -> None:
    """The generator writes the demo schema's columns; fail early when conf/ changed them."""
    expected = set(generate("eu", 2, 0).columns)
    if set(schema.columns) != expected:
        raise ValueError(
            f"synthetic data has columns {sorted(expected)} but the dataset schema declares "
            f"{sorted(schema.columns)}; seed only the demo dataset or adapt insitu/data/synthetic.py"
        )

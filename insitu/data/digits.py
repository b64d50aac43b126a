"""The handwritten-digits example: scikit-learn's 8×8 digits, split over the three demo sites with label skew.

``sklearn.datasets.load_digits()`` ships inside scikit-learn (1,797 images, no download). Each site holds
mostly its own *home* digits (eu 0–3, us 4–6, apac 7–9): 60 % of every digit goes to its home site and the
rest is spread evenly over the other two. That is the non-IID case federated averaging has to cope with (each
site sees few of the other sites' digits), while every site still keeps about 570–650 rows, so that its test
split (15 %, about 75–100 rows) stays well above the 20-row floor under which metrics are withheld.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

SITES = ("eu", "us", "apac")
# Which site holds most of each digit.
HOME_DIGITS: dict[str, tuple[int, ...]] = {"eu": (0, 1, 2, 3), "us": (4, 5, 6), "apac": (7, 8, 9)}
HOME_SHARE = 0.6
ID_COLUMN = "image_id"
LABEL_COLUMN = "digit"
PIXELS = [f"pixel_{i}" for i in range(64)]


def home_site(digit: int) -> str:
    return next(site for site, digits in HOME_DIGITS.items() if digit in digits)


def digits_frames(seed: int) -> dict[str, pd.DataFrame]:
    """One frame per site (``eu``, ``us``, ``apac``): ``image_id``, ``pixel_0`` … ``pixel_63`` (int 0–16) and
    ``digit`` (the label, a string ``"0"`` … ``"9"``, as the schema's category values are strings).

    The shares are fixed (60 % of each digit at its home site, 20 % at each other); ``seed`` decides which
    images go where and the row order. Identical seeds give identical frames. An image's id is its site and
    its index in scikit-learn's data (``eu-d-00042``), so ids are unique across sites.
    """
    from sklearn.datasets import load_digits  # imported here: only this example needs scikit-learn at run time

    data = load_digits()
    pixels = np.asarray(data.data, dtype=np.int64)
    target = np.asarray(data.target, dtype=np.int64)
    rng = np.random.default_rng([seed, 0xD1615])
    chosen: dict[str, list[np.ndarray]] = {site: [] for site in SITES}
    for digit in range(10):
        rows = rng.permutation(np.flatnonzero(target == digit))
        home = home_site(digit)
        others = [s for s in SITES if s != home]
        n_home = round(HOME_SHARE * len(rows))
        chosen[home].append(rows[:n_home])
        # The rest alternately: the other sites' counts differ by at most one row.
        rest = rows[n_home:]
        for i, site in enumerate(others):
            chosen[site].append(rest[i :: len(others)])
    frames: dict[str, pd.DataFrame] = {}
    for site in SITES:
        # Shuffled, so that a site's file is not sorted by digit (and a shard split of it is not skewed again).
        idx = rng.permutation(np.concatenate(chosen[site]))
        frame = pd.DataFrame(pixels[idx], columns=PIXELS)
        frame.insert(0, ID_COLUMN, [f"{site}-d-{i:05d}" for i in idx])
        frame[LABEL_COLUMN] = [str(d) for d in target[idx]]
        frames[site] = frame
    return frames

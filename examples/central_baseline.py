"""A central baseline scored on the same test rows as the federated model (docs/baselines.md walks through it).

Pools the raw shards in one place (here: the synthetic fraud data ``insitu seed`` writes, generated in
memory), keeps the rows preparation keeps, splits them as preparation does, trains a scikit-learn
logistic regression on the train rows and scores it on the test rows. Run from the checkout::

    python -m examples.central_baseline
"""

from __future__ import annotations

import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score, roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from insitu.conf import load_conf
from insitu.data import split_rows
from insitu.data.features import featurize
from insitu.data.synthetic import generate, inject_malformed


def raw_shards(rows_per_shard: int = 3000) -> list[pd.DataFrame]:
    """The fraud dataset's shards as their files hold them (some rows malformed, as in the demo)."""
    shards = []
    for i, site in enumerate(("eu", "us", "apac")):
        shards.append(inject_malformed(generate(site, rows_per_shard, seed=42, shard=0), 0.02, seed=i)[0])
    return shards


def central_baseline(rows_per_shard: int = 3000) -> dict[str, float]:
    """Train on the pooled train rows, score on the pooled test rows; test ROC-AUC and PR-AUC."""
    conf = load_conf("fraud")  # conf/training/fraud.yaml on conf/datasets.yaml's dataset 'fraud'
    schema = conf.dataset.schema_
    rows = pd.concat([split_rows(frame, schema, split_key=conf.dataset.split_key, split=conf.training.split)
                      for frame in raw_shards(rows_per_shard)], ignore_index=True)
    train, test = rows[rows["split"] == "train"], rows[rows["split"] == "test"]
    # The features preparation computes (one-hot categories, declared log1p); any others would do too.
    x_train, y_train = featurize(train, schema)
    x_test, y_test = featurize(test, schema)
    model = make_pipeline(StandardScaler(), LogisticRegression(class_weight="balanced", max_iter=1000))
    model.fit(x_train, y_train)
    score = model.predict_proba(x_test)[:, 1]
    return {"test_rows": float(len(test)), "roc_auc": float(roc_auc_score(y_test, score)),
            "pr_auc": float(average_precision_score(y_test, score))}


if __name__ == "__main__":
    print(central_baseline())  # a script's output, not library code

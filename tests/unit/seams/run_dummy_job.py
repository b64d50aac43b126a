"""Run a job naming the four dummy components, in a copy of the package (see test_extension_seams.py).

Arguments: the conf directory, a folder for the site's store. Prints one JSON line of what happened.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import insitu
from insitu.data.features import feature_names
from insitu.data.prepare import prepared_prefix
from insitu.federated.aggregators import Update, build_aggregator
from insitu.job import load_job
from insitu.models import build_model
from insitu.parallel import DataRef, TrainSpec
from insitu.parallel.site import train_site
from insitu.storage import Store

conf, store_dir = Path(sys.argv[1]), Path(sys.argv[2])
job = load_job("dummy", "fraud", directory=conf)
job.check_model()
n_features = len(feature_names(job.dataset.schema_))
rng = np.random.default_rng(0)
x = rng.normal(size=(256, n_features)).astype(np.float32)
y = (x[:, 0] > 0).astype(np.float32)
split = store_dir / prepared_prefix("fraud", "job") / "train"
split.mkdir(parents=True)
frame = pd.DataFrame(x, columns=[f"f{j}" for j in range(n_features)])
frame["label"] = y
frame.to_parquet(split / "shard-0.parquet", index=False)

torch.manual_seed(0)
start = build_model(job.training.model, n_features, job.task.n_outputs).state_dict()
spec = TrainSpec(job.training, job.task, n_features, start, DataRef(Store(f"file://{store_dir}/", {}), "fraud", "job"),
                 {"pos_weight": 1.0}, seed=1)
result = train_site(spec)
trained = result.state
other = {k: v.clone() + 1.0 if v.is_floating_point() else v.clone() for k, v in trained.items()}
aggregator = build_aggregator(job.training.aggregator.name, job.training.aggregator.options)
new_global, _ = aggregator.aggregate(0, start, [Update("eu", trained, 256), Update("us", other, 256)])
print(json.dumps({
    "package": insitu.__file__,
    "resolved": [job.task.name, job.training.model.name, job.aggregator.name, job.strategy.name],
    "parallelize_calls": sys.modules[job.strategy.parallelize.__module__].CALLS,
    "steps": int(result.metrics.get("steps", 0)),
    "trained_changed_weights": any(not torch.equal(trained[k], start[k]) for k in start
                                   if start[k].is_floating_point()),
    "aggregate_is_first_update": all(torch.equal(new_global[k], trained[k]) for k in trained
                                     if trained[k].is_floating_point()),
}))

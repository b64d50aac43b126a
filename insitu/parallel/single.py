"""Strategy ``single``: one process trains on all of the site's rows."""

from __future__ import annotations

from insitu.data.loader import load_split_cached
from insitu.models.fraud_mlp import build_model
from insitu.parallel.checkpoint import Checkpointer
from insitu.parallel.loop import rank_rows, train_epochs
from insitu.parallel.types import TrainResult, TrainSpec


def train(spec: TrainSpec) -> TrainResult:
    x, y = load_split_cached(spec.data.store, spec.data.dataset, spec.data.job_id, spec.data.split)
    rows = rank_rows(len(y), 0, 1, spec.seed)
    model = build_model(spec.training.model, spec.n_features)
    model.load_state_dict(spec.state)
    ckpt = Checkpointer(spec.checkpoint) if spec.checkpoint else None
    metrics = train_epochs(model, x[rows], y[rows], spec.training, spec.pos_weight, spec.seed, checkpointer=ckpt)
    return TrainResult({k: v.detach().clone() for k, v in model.state_dict().items()}, len(rows), metrics)

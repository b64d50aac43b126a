"""Strategy ``single``: one process trains on all of the site's rows."""

from __future__ import annotations

from insitu.data.loader import load_rank_part_cached
from insitu.models.fraud_mlp import build_model
from insitu.parallel.checkpoint import Checkpointer
from insitu.parallel.loop import train_epochs
from insitu.parallel.types import TrainResult, TrainSpec


def train(spec: TrainSpec) -> TrainResult:
    part = load_rank_part_cached(spec.data.store, spec.data.dataset, spec.data.job_id, spec.data.split, 0, 1)
    model = build_model(spec.training.model, spec.n_features)
    model.load_state_dict(spec.state)
    ckpt = Checkpointer(spec.checkpoint) if spec.checkpoint else None
    metrics = train_epochs(model, part.x, part.y, spec.training, spec.pos_weight, spec.seed, checkpointer=ckpt)
    return TrainResult({k: v.detach().clone() for k, v in model.state_dict().items()}, len(part.y), metrics)

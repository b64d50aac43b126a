"""Debug a site's training outside Prefect with plain ``torchrun``::

    torchrun --nproc-per-node 2 -m insitu.parallel.run --config conf/training/fraud_ddp.yaml \\
        --data file:///path/to/site-store/ --dataset fraud --job-id <job>

Each rank reads its block of the site's prepared train split (as written by ``site-prepare``), the ranks
combine their aggregate statistics into the split's normalisation, and each runs the same
``ddp.rank_main`` that the Dask launcher runs. The ranks' process group meets in a FileStore in a private
folder of the user (``insitu.parallel.rendezvous.torchrun_store``), not in torchrun's TCP store, which any local
user could reach (torchrun's own agent still listens on ``MASTER_PORT`` to start the ranks; the process group
never uses it). Ranks on several nodes need ``--rendezvous-dir`` on a shared filesystem. Rank 0 logs the
metrics and can save the trained state with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from insitu.conf import StorageRef
from insitu.data.features import label_classes
from insitu.data.loader import load_rank_part_cached
from insitu.federated.stats import combine, mean_std, partial_stats
from insitu.job import load_job
from insitu.models import Normalization, build_model
from insitu.parallel.rank import rank_main
from insitu.parallel.rendezvous import private_folder, torchrun_store
from insitu.parallel.types import DataRef, TrainSpec
from insitu.storage import store_from_env

log = logging.getLogger("insitu.parallel.run")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="training YAML (ranks are taken from torchrun)")
    ap.add_argument("--conf-dir", default=None, help="the conf/ folder whose datasets.yaml defines --dataset "
                    "(default: the folder above the training config's, as in conf/training/NAME.yaml)")
    ap.add_argument("--data", required=True, help="the site's store URL (file:// or s3:// with env credentials)")
    ap.add_argument("--dataset", default="fraud")
    ap.add_argument("--job-id", required=True, help="the job whose prepared data to train on")
    ap.add_argument("--endpoint-env", default=None, help="env var holding the S3 endpoint (s3:// stores)")
    ap.add_argument("--out", default=None, help="rank 0 writes the trained state dict here")
    ap.add_argument("--rendezvous-dir", default=None, help="a private folder (0700, yours) every rank sees, for "
                    "ranks on several nodes (default: a private folder under $TMPDIR; one node only)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s rank%(rank)s %(message)s")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    store = torchrun_store(os.environ, args.rendezvous_dir)
    private_folder(store.parent)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    old = logging.getLogRecordFactory()

    def factory(*a: object, **k: object) -> logging.LogRecord:
        rec = old(*a, **k)
        rec.rank = rank
        return rec

    logging.setLogRecordFactory(factory)
    try:
        conf_dir = args.conf_dir or Path(args.config).resolve().parent.parent
        conf = load_job(args.config, args.dataset, conf_dir)
        cfg, task = conf.training, conf.task
        ref = StorageRef(storage=args.data, endpoint_env=args.endpoint_env)
        store = store_from_env(ref, "this site")
        part = load_rank_part_cached(store, args.dataset, args.job_id, "train", rank, world)
        parts: list[dict[str, object] | None] = [None] * world
        # Aggregates only, as across sites.
        dist.all_gather_object(parts, partial_stats(part.x, part.y, label_classes(conf.dataset.schema_)))
        stats = combine(p for p in parts if p is not None)
        mean, std = mean_std(stats)
        n_features = part.x.shape[1]
        torch.manual_seed(cfg.seed)
        norm = Normalization(mean, std, *task.output_norm(stats))
        state = build_model(cfg.model, n_features, task.n_outputs, norm).state_dict()
        spec = TrainSpec(cfg, task, n_features, state, DataRef(store, args.dataset, args.job_id),
                         loss_params=task.loss_params(stats), seed=cfg.seed)
        result = rank_main(rank, world, spec)
        dist.barrier()
        if rank == 0 and result is not None:
            log.info("trained on %d rows with %d ranks: %s", result.n_samples, world, json.dumps(result.metrics))
            if args.out:
                torch.save(result.state, args.out)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: with gloo, torch sometimes aborts there ("terminate called without
    # an active exception") after the work is done and saved, and torchrun would report the rank as failed.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

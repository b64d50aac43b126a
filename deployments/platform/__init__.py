"""The local multi-site platform (``insitu up``/``down``): a process supervisor, not part of the core.

It starts, on 127.0.0.1, what production runs as managed services: the Prefect server, MLflow, one S3
endpoint per site and one for the exchange, a Dask cluster per site, and one worker per work pool, each
site's processes as their own OS user. Nothing in ``insitu/`` imports it; sites and ``torchrun`` never need it.

One job per module:

- ``supervisor``: ``Platform``, the operator's handle: ``up``, ``status``, ``down``, and every address, secret
  and environment the CLI and the tests ask it for
- ``paths``: where each actor's home, identity, policy, TLS keys, audit log and the servers' data live
- ``state``: the state file: ports and secrets chosen once, S3 keys and PIDs recorded, all read back
- ``actors``: the coordinator and the sites, their work pools and the OS users they run as
- ``endpoints``: the servers' URLs and addresses (from the recorded ports)
- ``env``: the exact environment each process starts with (a site gets only its own secrets)
- ``components``: the processes that make up the platform, tier by tier
- ``processes``: process control: start in a new session, wait until healthy, stop by PID, tier by tier
- ``health``: the components' health probes
- ``layout``: the directories and their owners, each actor's home (filled as the actor), the audit services' files
- ``provision``: S3 buckets and IAM users, MLflow's users, the work pools, once their servers run
- ``principals``: the demo principals' keys and each site's first signed policy
- ``users``: the OS accounts the actors run as, and directory ownership
- ``home``: fills an actor's home as that actor (``python -m deployments.platform.home``)
- ``s3``: one S3 endpoint, moto without its admin API (``python -m deployments.platform.s3``)
- ``mlflow_server``: the MLflow server's authentication (who may write the registry)
- ``pools``: the work pools with their locked job template
"""

from __future__ import annotations

from deployments.platform.actors import COORDINATOR
from deployments.platform.errors import PlatformError
from deployments.platform.paths import REPO
from deployments.platform.supervisor import Platform

__all__ = ["COORDINATOR", "REPO", "Platform", "PlatformError"]

"""The local multi-site platform (``insitu up``/``down``): a process supervisor, not part of the core.

It starts, on 127.0.0.1, what production runs as managed services: the Prefect server, MLflow, one S3
endpoint per site and one for the exchange, a Dask cluster per site, and one worker per work pool, each
site's processes as their own OS user. Nothing in ``insitu/`` imports it; sites and ``torchrun`` never need it.

One job per module:

- ``supervisor``: ``Platform``, which starts, checks and stops every component and builds each one's environment
- ``users``: the OS accounts the actors run as, and directory ownership
- ``home``: fills an actor's home as that actor (``python -m deployments.platform.home``)
- ``s3``: one S3 endpoint, moto without its admin API (``python -m deployments.platform.s3``)
- ``mlflow_server``: the MLflow server's authentication (who may write the registry)
- ``pools``: the work pools with their locked job template
"""

from __future__ import annotations

from deployments.platform.supervisor import COORDINATOR, REPO, Platform, PlatformError

__all__ = ["COORDINATOR", "REPO", "Platform", "PlatformError"]

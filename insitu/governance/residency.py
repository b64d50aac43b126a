"""The site guard: a site reads only shards pinned to it, whatever the coordinator asks.

The site's identity comes from its own identity file (``insitu.governance.identity``), and the pinning
from the site's own copy of ``conf/datasets.yaml``; neither is taken from the request. Every refusal is
audited with who asked, what, and which rule refused it.
"""

from __future__ import annotations

from collections.abc import Sequence

from insitu.conf import DatasetConfig, ShardConfig
from insitu.governance.audit_service import Auditor

RULE_PINNED = "residency.shard-pinned-to-site"
RULE_UNKNOWN = "residency.shard-declared"


class ResidencyError(PermissionError):
    """A request would read data that is not pinned to this site."""



def admit_shards(
    site: str,
    requested: Sequence[str] | None,
    dataset_name: str,
    dataset: DatasetConfig,
    audit: Auditor,
    principal: str,
    job_id: str,
    flow_run_id: str | None,
) -> list[ShardConfig]:
    """Shards this site may read for the request; ``None`` means all shards pinned here.

    Raises
    ------
    ResidencyError
        On the first shard that is unknown or pinned to another site; the refusal is audited.
    """
    if requested is None:
        return dataset.shards_of(site)
    admitted = []
    for shard_id in requested:
        try:
            shard = dataset.shard(shard_id)
        except KeyError:
            shard = None
        if shard is None or shard.site != site:
            rule = RULE_UNKNOWN if shard is None else RULE_PINNED
            where = "is not declared in conf/datasets.yaml" if shard is None else f"is pinned to site {shard.site!r}"
            msg = (
                f"site {site!r} refuses to read shard {shard_id!r} of dataset {dataset_name!r} for "
                f"{principal!r} (job {job_id}): the shard {where}; rule {rule}"
            )
            audit.append(
                "residency.refused",
                shard=shard_id,
                dataset=dataset_name,
                principal=principal,
                job_id=job_id,
                flow_run_id=flow_run_id,
                rule=rule,
                pinned_to=shard.site if shard else None,
                reason=msg,
            )
            raise ResidencyError(msg)
        admitted.append(shard)
    return admitted


RULE_ALL_PINNED = "residency.all-pinned-shards"


def site_shards(
    site: str,
    requested: Sequence[str] | None,
    dataset_name: str,
    dataset: DatasetConfig,
    audit: Auditor,
    principal: str,
    job_id: str,
    flow_run_id: str | None,
) -> list[ShardConfig]:
    """The shards this site reads for the signed ``dataset_name``: every shard its own datasets.yaml pins here.

    A run's ``shards`` parameter is not signed, so it decides nothing: when given, each shard must be pinned here
    (:func:`admit_shards`) and together they must be exactly the site's own, else the run is refused (audited,
    rule ``residency.all-pinned-shards``) rather than narrowed or widened by whoever set the parameter.
    """
    derived = dataset.shards_of(site)
    if requested is None:
        return derived
    admitted = admit_shards(site, requested, dataset_name, dataset, audit, principal, job_id, flow_run_id)
    if sorted(s.id for s in admitted) == sorted(s.id for s in derived):
        return derived
    msg = (f"site {site!r} refuses to read shards {sorted(requested)[:20]} of dataset {dataset_name!r} for "
           f"{principal!r} (job {job_id}): a site reads every shard its own datasets.yaml pins to it for the signed "
           f"dataset ({sorted(s.id for s in derived)}), not a list from the run's unsigned parameters; "
           f"rule {RULE_ALL_PINNED}")
    audit.append("residency.refused", dataset=dataset_name, principal=principal, job_id=job_id,
                 flow_run_id=flow_run_id, rule=RULE_ALL_PINNED, shards=sorted(requested)[:20], reason=msg)
    raise ResidencyError(msg)

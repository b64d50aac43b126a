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

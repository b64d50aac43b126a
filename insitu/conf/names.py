"""The names a configuration may use: sites, environment variables, configs, job ids, import paths."""

from __future__ import annotations

import re

from insitu.conf.errors import short

SITE_NAME = r"^[a-z][a-z0-9-]{0,30}$"
ENV_NAME = r"^[A-Z_][A-Z0-9_]*$"
# What a run may name: a training config (a file of conf/training/) or a dataset (a key of datasets.yaml).
CONF_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
# A job id becomes part of store prefixes, run names and registry tags: plain characters only, no '/'.
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
# A user's own model: "package.module:factory" (see insitu/models/__init__.py for the contract).
IMPORT_PATH = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


def check_job_id(job_id: str) -> str:
    """``job_id`` if it matches :data:`JOB_ID_PATTERN`.

    Raises
    ------
    ValueError
        When it does not (the message shows at most 40 characters of it).
    """
    # fullmatch, not match: '$' alone would let a trailing newline through.
    if not isinstance(job_id, str) or not re.fullmatch(JOB_ID_PATTERN, job_id):
        raise ValueError(
            f"job_id {short(job_id)} is not a job id: use 1-100 letters, digits, '.', '_' or '-', starting "
            f"with a letter or digit ({JOB_ID_PATTERN})"
        )
    return job_id

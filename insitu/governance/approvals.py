"""Standing approvals: signed requests without a job id, for runs that no person signs at start time.

A run started from the Prefect UI or by a schedule has no principal at its keyboard. It may run only a
training configuration that a principal approved beforehand (``insitu approve --as NAME``): a signed
request with no ``job_id`` and bounds on the overrides. The coordinator finds the approval for the run's
training and dataset here and forwards it unchanged; each site checks it against its own policy as it
would any request. Approvals are signed statements, not secrets: anyone may read them, nobody can alter
one without breaking its signature.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from pathlib import Path

from insitu.governance.request import RequestError, SignedRequest, parse_signed

log = logging.getLogger(__name__)

ENV_APPROVALS = "INSITU_APPROVALS_DIR"


def approvals_dir() -> Path | None:
    d = os.environ.get(ENV_APPROVALS)
    return Path(d) if d else None


def approval_path(directory: Path, training: str, dataset: str) -> Path:
    # '@' is in neither name's alphabet, so no two (training, dataset) pairs share a file.
    return directory / f"{training}@{dataset}.json"


def save_approval(directory: Path, signed: SignedRequest) -> Path:
    """Write (replace) the approval for its training and dataset; returns the file."""
    if not signed.request.standing:
        raise RequestError("an approval has no job_id; this request is bound to a job")
    path = approval_path(directory, signed.request.training, signed.request.dataset)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(signed.model_dump_json(indent=2))
    tmp.chmod(0o644)
    os.replace(tmp, path)
    return path


def find_approval(directory: Path | None, training: str, dataset: str,
                  now: datetime | None = None) -> SignedRequest | None:
    """The unexpired approval for ``training`` on ``dataset``, or None."""
    if directory is None:
        return None
    path = approval_path(directory, training, dataset)
    try:
        signed = parse_signed(path.read_text())
    except FileNotFoundError:
        return None
    except RequestError as e:
        log.warning("ignoring approval %s: %s", path, e)
        return None
    if signed.request.expires_at <= (now or datetime.now(UTC)):
        log.warning("approval %s expired at %s", path, signed.request.expires_at)
        return None
    return signed

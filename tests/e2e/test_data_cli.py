"""`insitu data put|ls` on the running platform: a file lands in its own site's store, nowhere else."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import s3fs

from deployments.cli import site_store as data
from deployments.platform import Platform

pytestmark = pytest.mark.e2e


def test_a_file_put_into_a_site_lands_in_that_sites_store_only(deployed: Platform, tmp_path: Path) -> None:
    f = tmp_path / "hospital.csv"
    f.write_text("patient_id,age\np1,40\n")
    key = f"raw/e2e-upload-{uuid.uuid4().hex[:6]}/hospital.csv"
    url = data.put(deployed, "eu", f, key)
    assert url == f"s3://insitu-eu/{key}"
    assert (key, f.stat().st_size) in data.ls(deployed, "eu", key.rsplit("/", 1)[0])
    assert s3fs.S3FileSystem(**deployed.storage_options("eu", "eu")).cat(f"insitu-eu/{key}") == f.read_bytes()
    assert not [k for k, _ in data.ls(deployed, "us", "raw") if "e2e-upload" in k]
    for bad in ("../etc/passwd", "/abs/key", "raw/../../x"):
        with pytest.raises(data.DataCliError, match="relative path inside the site's store"):
            data.put(deployed, "eu", f, bad)

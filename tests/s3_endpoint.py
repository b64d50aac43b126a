"""The platform's S3 endpoint (``python -m deployments.platform.s3``) in a subprocess on a free port, for the tests
that drive one endpoint by hand rather than through a whole platform. Stopped (or killed) by its PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import s3fs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Endpoint:
    """One endpoint: moto's server with its admin API refused, optionally writing through to ``data``.

    ``no_auth`` is ``INITIAL_NO_AUTH_ACTION_COUNT`` (the set-up calls allowed before every request must be signed);
    None leaves it unset, as an endpoint that was never provisioned would be."""

    def __init__(self, log: Path, no_auth: int | None, data: Path | None = None, write_once: str = "",
                 port: int | None = None) -> None:
        self.port = port or free_port()  # a port: the same endpoint started again where its clients look for it
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1"}
        env.pop("INITIAL_NO_AUTH_ACTION_COUNT", None)
        if no_auth is not None:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(no_auth)
        argv = [sys.executable, "-m", "deployments.platform.s3", "--port", str(self.port)]
        if data is not None:
            argv += ["--data", str(data)]
        if write_once:
            argv += ["--write-once", write_once]
        self.log = open(log, "ab")  # noqa: SIM115 (closed in stop / kill)
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:  # the refused /moto-api/ is not counted against INITIAL_NO_AUTH_ACTION_COUNT
                urllib.request.urlopen(self.url + "/moto-api/", timeout=1).close()
                return
            except urllib.error.HTTPError as e:
                assert e.code == 403, e  # up, and its admin API refused
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the S3 endpoint on {self.port} did not start; see {log}") from None
                time.sleep(0.1)

    def fs(self, key: tuple[str, str]) -> s3fs.S3FileSystem:
        """A client with one of the keys :func:`insitu.governance.iam.provision` issued."""
        return s3fs.S3FileSystem(key=key[0], secret=key[1], client_kwargs={"endpoint_url": self.url},
                                 skip_instance_cache=True, use_listings_cache=False)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush; only what was written through survives."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()

"""The addresses of the local platform's servers, all on 127.0.0.1 at the ports the state file holds."""

from __future__ import annotations

from deployments.platform.state import PlatformState


class Endpoints:
    """URLs and addresses built from the recorded ports (read at each call: ``--port`` options update them)."""

    def __init__(self, state: PlatformState) -> None:
        self._state = state

    def port(self, name: str) -> int:
        return self._state.port(name)

    @property
    def prefect_api_url(self) -> str:
        return f"http://127.0.0.1:{self.port('prefect')}/api"

    @property
    def prefect_ui_url(self) -> str:
        return f"http://127.0.0.1:{self.port('prefect')}"

    @property
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.port('mlflow')}"

    def s3_endpoint(self, owner: str) -> str:
        return f"http://127.0.0.1:{self.port(f's3-{owner}')}"

    def dask_address(self, site: str) -> str:
        return f"tls://127.0.0.1:{self.port(f'dask-{site}')}"

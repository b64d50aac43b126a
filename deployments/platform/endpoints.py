"""The addresses of the local platform's servers, all on 127.0.0.1 at the ports the state file holds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from deployments.platform.state import PlatformState

if TYPE_CHECKING:
    from deployments.platform.border import Borders


class Endpoints:
    """URLs and addresses built from the recorded ports (read at each call: ``--port`` options update them)."""

    def __init__(self, state: PlatformState, borders: Borders | None = None) -> None:
        self._state = state
        self._borders = borders

    def _crossing(self, actor: str | None, server: str) -> int:
        """The port ``actor``'s processes use for the control plane's ``server``: its border relay's, if it has one."""
        if self._borders is not None and self._borders.behind(actor):
            return self._borders.port(actor, server)  # type: ignore[arg-type]
        return self.port(server)

    def prefect_api_url_for(self, actor: str | None) -> str:
        return f"http://127.0.0.1:{self._crossing(actor, 'prefect')}/api"

    def s3_endpoint_for(self, actor: str | None, owner: str) -> str:
        """``owner``'s store as ``actor`` reaches it: the exchange across the actor's border, its own store directly."""
        if owner == "exchange":
            return f"http://127.0.0.1:{self._crossing(actor, 's3-exchange')}"
        return self.s3_endpoint(owner)

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

"""The addresses of the local platform's servers, at the ports the state file holds, as each actor reaches them.

On one network everything is on 127.0.0.1. On an isolated platform (``platform.netns``) each actor has its own
view: the control plane's processes reach their servers on their own loopback, a site reaches the control plane at
the address of the control plane's end of its own border, the operator (the host) at the end of the host's link;
a site's store and Dask scheduler are on its own loopback, reachable from inside that site alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deployments.platform.state import PlatformState

if TYPE_CHECKING:
    from deployments.platform.border import Borders
    from deployments.platform.netns import NetPlan

LOOPBACK = "127.0.0.1"


class Endpoints:
    """URLs and addresses built from the recorded ports (read at each call: ``--port`` options update them)."""

    def __init__(self, state: PlatformState, borders: Borders | None = None, net: NetPlan | None = None) -> None:
        self._state = state
        self._borders = borders
        self.net = net  # the isolated platform's namespaces and addresses (None: one network)

    def control_host(self, actor: str | None) -> str:
        """Where ``actor`` reaches the control plane's servers: a site at its border's far end, the operator (None)
        at the host link's, the coordinator (which runs in the control plane) on its own loopback."""
        from deployments.platform.actors import COORDINATOR

        if self.net is None or actor == COORDINATOR:
            return LOOPBACK
        return self.net.control_address(actor)

    @property
    def bind_host(self) -> str:
        """What the control plane's servers listen on: loopback, or every address of the control plane's own
        namespace (its loopback and the near end of each border: nothing else exists there)."""
        return LOOPBACK if self.net is None else "0.0.0.0"  # noqa: S104 (the namespace's own links only)

    def crossing_port(self, actor: str | None, server: str) -> int:
        """The port ``actor``'s processes use for the control plane's ``server``: its border relay's, if it has one."""
        if self._borders is not None and self._borders.behind(actor):
            return self._borders.port(actor, server)  # type: ignore[arg-type]
        return self.port(server)

    def prefect_api_url_for(self, actor: str | None) -> str:
        return f"http://{self.control_host(actor)}:{self.crossing_port(actor, 'prefect')}/api"

    def mlflow_url_for(self, actor: str | None) -> str:
        return f"http://{self.control_host(actor)}:{self.port('mlflow')}"

    def s3_endpoint_for(self, actor: str | None, owner: str) -> str:
        """``owner``'s store as ``actor`` reaches it: the exchange across the actor's border, its own store directly."""
        if owner == "exchange":
            return f"http://{self.control_host(actor)}:{self.crossing_port(actor, 's3-exchange')}"
        return self.s3_endpoint(owner)

    def port(self, name: str) -> int:
        return self._state.port(name)

    # The operator's view (the CLI, the browser, the tests).
    @property
    def prefect_api_url(self) -> str:
        return f"http://{self.control_host(None)}:{self.port('prefect')}/api"

    @property
    def prefect_ui_url(self) -> str:
        return f"http://{self.control_host(None)}:{self.port('prefect')}"

    @property
    def mlflow_url(self) -> str:
        return self.mlflow_url_for(None)

    def s3_endpoint(self, owner: str) -> str:
        """The exchange as the operator reaches it; a site's store on that site's own loopback (on an isolated
        platform: from inside the site only)."""
        host = self.control_host(None) if owner == "exchange" else LOOPBACK
        return f"http://{host}:{self.port(f's3-{owner}')}"

    def dask_address(self, site: str) -> str:
        return f"tls://{LOOPBACK}:{self.port(f'dask-{site}')}"

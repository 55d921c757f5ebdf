"""``KubeHTTP``'s backend over an official ``kubernetes.client.ApiClient`` (see
agent.kube.transport).

Used for clients tests build (``FakeAPIServer.api_client()``) and for kubeconfigs the lean
loader leaves to ``kubernetes.config`` (exec plugins, auth providers).
"""

from __future__ import annotations

from typing import Any


class OfficialBackend:
    """Requests through a ``kubernetes.client.ApiClient``: its host, auth and urllib3 pool.

    ``param_serialize`` builds the URL and the auth headers (running the configuration's token
    refresh hook); the request goes straight to the client's pool so the body is sent as our
    bytes (its REST layer would json-encode bytes again for JSON content types).
    """

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    @property
    def server(self) -> str:
        return str(self.api_client.configuration.host)

    def send(
        self,
        method: str,
        path_and_query: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout: Any,
        *,
        stream: bool = False,
    ) -> Any:
        """``stream`` is accepted and ignored: the official client has one pool."""
        _, url, header_params, _, _ = self.api_client.param_serialize(
            method, path_and_query, header_params=dict(headers), auth_settings=["BearerToken"]
        )
        pool = self.api_client.rest_client.pool_manager
        return pool.request(
            method, url, body=body, headers=header_params, timeout=timeout,
            preload_content=False, redirect=False,
        )  # fmt: skip

    def close(self) -> None:
        self.api_client.close()

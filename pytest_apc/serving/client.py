"""The plugin's HTTP client for servers, routers and gateways: the API key as a bearer token, TLS verified
with the CA bundle given (``--apc-set ca_bundle``) whatever the environment says."""

from __future__ import annotations

from typing import Any

import requests


class Client(requests.Session):
    """requests' Session whose own CA bundle wins: requests lets REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE in the
    environment override ``Session.verify``, and many machines set them to the system bundle."""

    def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any) -> Any:
        merged = super().merge_environment_settings(url, proxies, stream, verify, cert)
        if isinstance(self.verify, str):
            merged["verify"] = self.verify
        return merged


def http_session(api_key: str, ca_bundle: str) -> requests.Session:
    """An HTTP client of the plugin: the API key as a bearer token; TLS verified with ``ca_bundle`` (a
    private CA's bundle) when one is given, else with the default bundle."""
    http = Client()
    if ca_bundle:
        http.verify = ca_bundle
    if api_key:
        http.headers["Authorization"] = f"Bearer {api_key}"
    return http

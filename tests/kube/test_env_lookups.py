"""The Kubernetes client's HTTP session skips proxy and netrc look-ups the environment does not ask for."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from nymph.kube.api import without_env_lookups


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for key in list(os.environ):
        if key.lower().endswith("_proxy"):
            monkeypatch.delenv(key)
    monkeypatch.delenv("NETRC", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


async def _trust_env() -> bool:
    api = without_env_lookups(client.ApiClient(configuration=client.Configuration()))
    try:
        return bool(api.rest_client.pool_manager.trust_env)
    finally:
        await api.close()


async def test_no_proxy_and_no_netrc_means_no_look_ups(bare_env: Path) -> None:
    assert await _trust_env() is False


async def test_a_proxy_or_a_netrc_in_the_environment_is_still_honoured(
    bare_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    assert await _trust_env() is True
    monkeypatch.delenv("HTTPS_PROXY")
    (bare_env / ".netrc").write_text("machine example login a password b\n")
    assert await _trust_env() is True

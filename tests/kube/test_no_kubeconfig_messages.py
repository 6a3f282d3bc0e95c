"""A provider that names no kubeconfig: the error says what is missing and what to do, whether
the queue lends no credentials or lends a host's that has none."""

from __future__ import annotations

from pathlib import Path

import pytest

from nymph.errors import CredentialsError
from nymph.kube.credentials import CredentialPolicy
from nymph.kube.pods import Connection, load_api


async def test_a_host_without_credentials_says_what_to_add(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ambient credentials allowed, but the host has none: not 'cannot be loaded as a kubeconfig'."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(CredentialsError) as info:
        await load_api(Connection(), policy=CredentialPolicy(ambient=True))
    text = str(info.value)
    assert "names no kubeconfig" in text and "no credentials of its own" in text
    assert "--kwarg kubeconfig=" in text and "--dispatch daemon" in text


async def test_a_queue_that_lends_nothing_says_what_to_add() -> None:
    """No ambient credentials: the error names the kwarg, the daemon path and the operator's flag."""
    with pytest.raises(CredentialsError) as info:
        await load_api(Connection(), policy=CredentialPolicy(ambient=False))
    text = str(info.value)
    assert "--kwarg kubeconfig=" in text and "--dispatch daemon" in text and "--ambient-kubeconfig" in text

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

import pytest
import structlog

from nymph.errors import CredentialsError
from nymph.kube.credentials import (
    ChainSecretResolver,
    CredentialPolicy,
    EnvSecretResolver,
    FileSecretResolver,
    allowed_path,
    describe,
    looks_like_path,
    staged_kubeconfig,
)
from nymph.logsetup import configure_logging

SECRET = "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user: {token: s3cr3t-t0ken-value}\n"


@pytest.mark.parametrize(
    ("value", "is_path"),
    [
        ("/etc/kube", True),
        ("./kc", True),
        ("~/.kube/config", True),
        ("apiVersion: v1", False),
        ("/a\nb", False),
        ("kc.yaml", False),
    ],
)
def test_path_detection(value: str, is_path: bool) -> None:
    assert looks_like_path(value) is is_path


def test_no_kubeconfig_means_default_loading() -> None:
    with staged_kubeconfig(None) as path:
        assert path is None


def test_path_is_used_in_place(tmp_path: Path) -> None:
    kc = tmp_path / "kc"
    kc.write_text(SECRET)
    with staged_kubeconfig(str(kc)) as path:
        assert path == str(kc)
    assert kc.exists()


def test_missing_path_is_a_clear_error() -> None:
    with pytest.raises(CredentialsError, match="does not exist"), staged_kubeconfig("/no/such/kubeconfig"):
        pass


def test_inline_content_is_staged_600_and_removed(tmp_path: Path) -> None:
    with staged_kubeconfig(SECRET, tmpdir=str(tmp_path)) as path:
        assert path is not None
        assert Path(path).read_text() == SECRET
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not Path(path).exists()


def test_secret_ref_is_resolved_staged_and_removed_even_on_failure(tmp_path: Path) -> None:
    resolver = EnvSecretResolver(environ={"NYMPH_SECRET_PROD_KUBE": SECRET})
    seen = None
    with (
        pytest.raises(RuntimeError),
        staged_kubeconfig({"$secret": "prod-kube"}, resolver=resolver, tmpdir=str(tmp_path)) as path,
    ):
        seen = path
        assert Path(path).read_text() == SECRET  # type: ignore[arg-type]
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # type: ignore[arg-type]
        raise RuntimeError("apply failed")
    assert seen is not None and not Path(seen).exists()
    assert list(tmp_path.iterdir()) == []


def test_file_resolver_and_chain(tmp_path: Path) -> None:
    (tmp_path / "kc").write_text(SECRET)
    chain = ChainSecretResolver([EnvSecretResolver(environ={}), FileSecretResolver(tmp_path)])
    assert chain.resolve("kc") == SECRET
    with pytest.raises(CredentialsError) as info:
        chain.resolve("missing")
    assert "NYMPH_SECRET_MISSING" in str(info.value)


@pytest.mark.parametrize("ref", [{"$secret": "../etc/passwd"}, {"$secret": 3}, {"$secret": "a", "x": 1}, 42])
def test_bad_refs_are_rejected(ref: object) -> None:
    with pytest.raises(CredentialsError), staged_kubeconfig(ref, resolver=EnvSecretResolver(environ={})):
        pass


def test_secret_text_never_reaches_logs_or_errors(tmp_path: Path) -> None:
    buf = io.StringIO()
    configure_logging(fmt="json", stream=buf)
    log = structlog.get_logger().bind(component="test")
    resolver = EnvSecretResolver(environ={"NYMPH_SECRET_K": SECRET})
    with staged_kubeconfig({"$secret": "k"}, resolver=resolver, tmpdir=str(tmp_path)) as path:
        content = Path(path).read_text()  # type: ignore[arg-type]
        log.info("staged", text=content, kubeconfig=content, detail=f"oops {content}")
    log.info("describe", ref=describe({"$secret": "k"}))
    out = buf.getvalue()
    assert "s3cr3t-t0ken-value" not in out
    assert "secret:k" in out
    for line in out.splitlines():
        json.loads(line)
    # Errors about secrets name the secret, never its content.
    with pytest.raises(CredentialsError) as info, staged_kubeconfig({"$secret": "nope"}, resolver=resolver):
        pass
    assert "s3cr3t" not in str(info.value)


def test_describe_never_returns_content() -> None:
    assert describe(SECRET) == "inline"
    assert describe("/p") == "path:/p"
    assert describe(None) == "default"


def _dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    bare, a, b = tmp_path / "bare", tmp_path / "team-a", tmp_path / "team-b"
    for d in (bare, a, b):
        d.mkdir()
        (d / "kc.yaml").write_text(SECRET)
    return bare, a, b


def test_a_team_directory_serves_its_namespace_and_a_bare_one_only_unscoped_callers(tmp_path: Path) -> None:
    bare, a, b = _dirs(tmp_path)
    policy = CredentialPolicy(kubeconfig_dirs=(bare,), team_dirs=(("team-a", a), ("team-b", b)))
    assert allowed_path(str(a / "kc.yaml"), policy=policy, namespace="team-a", bare=False)
    with pytest.raises(CredentialsError, match="--kubeconfig-dir team-a=DIR") as info:
        allowed_path(str(b / "kc.yaml"), policy=policy, namespace="team-a", bare=False)
    assert f"({a}, symlinks resolved)" in str(info.value)  # only its own directories are named
    with pytest.raises(CredentialsError, match="--kubeconfig-dir team-a=DIR"):
        allowed_path(str(bare / "kc.yaml"), policy=policy, namespace="team-a", bare=False)
    # an unscoped caller (and a load) may use the bare directories, never another team's
    assert allowed_path(str(bare / "kc.yaml"), policy=policy, namespace="team-a", bare=True)
    with pytest.raises(CredentialsError):
        allowed_path(str(b / "kc.yaml"), policy=policy, namespace="team-a", bare=True)
    only_teams = CredentialPolicy(kubeconfig_dirs=(), team_dirs=(("team-a", a),))
    with pytest.raises(CredentialsError, match="reads no kubeconfig files for namespace team-b"):
        allowed_path(str(a / "kc.yaml"), policy=only_teams, namespace="team-b", bare=True)


def test_a_path_with_a_nul_byte_is_a_clear_error() -> None:
    with pytest.raises(CredentialsError, match="NUL"):
        allowed_path("/etc/kube\0config", policy=CredentialPolicy(kubeconfig_dirs=()))


def test_staged_inline_content_is_held_to_the_allow_list(tmp_path: Path) -> None:
    text = "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    exec: {command: /bin/sh}\n"
    with (
        pytest.raises(CredentialsError, match=r"users\[0\]\.user\.exec"),
        staged_kubeconfig(text, tmpdir=str(tmp_path)),
    ):
        pass
    assert list(tmp_path.iterdir()) == []

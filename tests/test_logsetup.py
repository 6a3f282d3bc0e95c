from __future__ import annotations

import io
import json

import structlog

from nymph.logsetup import REDACTED, configure_logging, forget_secret, register_secret


def test_json_when_not_a_tty_and_sensitive_keys_redacted() -> None:
    buf = io.StringIO()
    configure_logging(fmt="auto", stream=buf)
    structlog.get_logger().info(
        "hello", token="abc123456", authorization="Bearer x", nested={"password": "p", "ok": 1}
    )
    rec = json.loads(buf.getvalue())
    assert rec["event"] == "hello"
    assert rec["token"] == REDACTED and rec["authorization"] == REDACTED
    assert rec["nested"] == {"password": REDACTED, "ok": 1}


def test_registered_secrets_masked_anywhere() -> None:
    buf = io.StringIO()
    configure_logging(fmt="console", stream=buf)
    register_secret("very-secret-value")
    try:
        structlog.get_logger().info("got very-secret-value here", detail=["x very-secret-value y"])
    finally:
        forget_secret("very-secret-value")
    out = buf.getvalue()
    assert "very-secret-value" not in out
    assert REDACTED in out


class _Opaque:
    def __repr__(self) -> str:
        return "<opaque thing>"


def test_json_lines_keep_what_orjson_refuses_and_name_what_is_not_json() -> None:
    """A value JSON cannot hold is written as its repr, and an integer past 64 bits or a key
    that is not a string is still written: a log call never fails for the value it carries."""
    buf = io.StringIO()
    configure_logging(fmt="json", stream=buf)
    log = structlog.get_logger()
    log.info("odd", thing=_Opaque(), big=2**70, counts={1: "one"}, text="caf\u00e9")
    rec = json.loads(buf.getvalue())
    assert rec["thing"] == "<opaque thing>"
    assert rec["big"] == 2**70
    assert rec["counts"] == {"1": "one"}
    assert rec["text"] == "caf\u00e9"
    assert rec["event"] == "odd" and rec["level"] == "info"


def test_the_longest_registered_secret_is_masked_whole_and_a_forgotten_one_no_longer() -> None:
    """Secrets are masked longest first (one that holds another is not left half shown), the
    same keys are judged sensitive at every line, and a forgotten value is shown again."""
    from nymph.logsetup import redact_text

    register_secret("abcdef")
    register_secret("xxabcdefyy")
    try:
        assert redact_text("a xxabcdefyy b abcdef") == f"a {REDACTED} b {REDACTED}"
        buf = io.StringIO()
        configure_logging(fmt="json", stream=buf)
        for _ in range(2):  # the second line judges the keys from what the first learnt
            structlog.get_logger().info("x", api_token="t0k3n-value", note="has xxabcdefyy in it")
        for line in buf.getvalue().splitlines():
            rec = json.loads(line)
            assert rec["api_token"] == REDACTED and rec["note"] == f"has {REDACTED} in it"
    finally:
        forget_secret("abcdef")
        forget_secret("xxabcdefyy")
    assert redact_text("a xxabcdefyy b abcdef") == "a xxabcdefyy b abcdef"

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

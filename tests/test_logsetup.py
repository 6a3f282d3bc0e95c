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

"""structlog set-up: JSON when stderr is not a terminal, console when it is, and redaction.

Redaction is the last line of defence, not the first: secret values are never passed to a
logger on purpose. Still, any event key that looks like it carries a secret (``token``,
``password``, ``kubeconfig``, ``secret``, ``authorization``) is replaced by ``"[redacted]"``, and
every string value registered with :func:`register_secret` is masked wherever it appears.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import MutableMapping
from typing import Any

import structlog

from nymph import fastjson

REDACTED = "[redacted]"
_SENSITIVE_KEY = re.compile(r"(token|password|passwd|secret|kubeconfig|authorization|credential)", re.I)
_lock = threading.Lock()
_secrets: set[str] = set()
#: The registered secrets, longest first (so one inside another is masked whole): rebuilt at
#: each change, read without the lock at every log line.
_by_length: tuple[str, ...] = ()
#: Whether an event key names a secret, by key (a process logs a few dozen distinct keys).
_key_verdicts: dict[str, bool] = {}


def register_secret(value: str) -> None:
    """Mask ``value`` in every log line from now on (values shorter than 6 chars are ignored)."""
    if isinstance(value, str) and len(value) >= 6:
        with _lock:
            _secrets.add(value)
            _rebuild()


def forget_secret(value: str) -> None:
    with _lock:
        _secrets.discard(value)
        _rebuild()


def _rebuild() -> None:
    global _by_length
    _by_length = tuple(sorted(_secrets, key=len, reverse=True))


def redact_text(text: str) -> str:
    for s in _by_length:
        if s in text:
            text = text.replace(s, REDACTED)
    return text


def _sensitive_key(key: str) -> bool:
    verdict = _key_verdicts.get(key)
    if verdict is None:
        verdict = bool(_SENSITIVE_KEY.search(key))
        if len(_key_verdicts) < 4096:
            _key_verdicts[key] = verdict
    return verdict


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value) if _by_length else value
    if isinstance(value, dict):
        return {k: (REDACTED if _sensitive_key(str(k)) else _redact_value(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redact_value(v) for v in value)
    return value


def redact_processor(
    _logger: Any, _name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key in list(event_dict):
        if key != "event" and _sensitive_key(key) and event_dict[key] is not None:
            event_dict[key] = REDACTED
        else:
            event_dict[key] = _redact_value(event_dict[key])
    return event_dict


def _json_line(event_dict: Any, default: Any = None, **_kw: Any) -> str:
    """A log line's JSON (:func:`nymph.fastjson.dumps_text`, with structlog's ``default``)."""
    return fastjson.dumps_text(event_dict, default=default)


class _Stderr:
    """Writes to whatever ``sys.stderr`` is at the time of the write (not at configuration),
    so a logger configured under a test's captured stderr keeps working after it closes."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def configure_logging(*, fmt: str = "auto", level: str = "info", stream: Any = None) -> None:
    stream = stream or _Stderr()
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        lvl = logging.INFO
    use_console = fmt == "console" or (fmt == "auto" and hasattr(stream, "isatty") and stream.isatty())
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=False)
        if use_console
        else structlog.processors.JSONRenderer(serializer=_json_line)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_processor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )


def get_logger(component: str, **bound: Any) -> Any:
    return structlog.get_logger().bind(component=component, **bound)

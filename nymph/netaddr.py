"""Listen addresses: ``HOST:PORT`` text to a (host, port) pair (pure; shared by the queue's and
the daemon's servers)."""

from __future__ import annotations

from nymph.errors import ConfigError

#: Where ``nymph queue serve`` listens and the CLI looks for it unless told otherwise.
DEFAULT_LISTEN = "127.0.0.1:8700"
DEFAULT_URL = "http://127.0.0.1:8700"


def parse_listen(text: str, *, example: str, default_host: str | None = None) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8700`` for IPv6) -> (host, port); port 0 picks a free one.

    An empty host (``:8700``) becomes ``default_host`` when one is given and is an error
    otherwise. A :class:`ConfigError` names the ``--listen`` value and shows ``example``.
    """
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]") or (default_host or "")
    port = int(port_text) if port_text.isdigit() and port_text.isascii() else -1
    if not sep or not host or not 0 <= port <= 65535:
        raise ConfigError(f"--listen {text!r}: expected HOST:PORT, e.g. {example}")
    return host, port


def url_host(host: str) -> str:
    """``host`` as it goes in a URL: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host

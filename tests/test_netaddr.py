"""``--listen HOST:PORT`` parsing, shared by the queue's and the daemon's servers."""

from __future__ import annotations

import pytest

from nymph.errors import ConfigError
from nymph.netaddr import parse_listen, url_host

EXAMPLE = "127.0.0.1:8700"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8700", ("127.0.0.1", 8700)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("[::1]:8700", ("::1", 8700)),
        ("[::]:65535", ("::", 65535)),
        ("localhost:1", ("localhost", 1)),
    ],
)
def test_good_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text, example=EXAMPLE) == expected


@pytest.mark.parametrize(
    "text", ["", "8700", ":8700", "host:", "host:port", "host:65536", "host:-1", "[]:80"]
)
def test_bad_addresses_name_the_value_and_an_example(text: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_listen(text, example=EXAMPLE)
    assert str(err.value) == f"--listen {text!r}: expected HOST:PORT, e.g. {EXAMPLE}"


def test_an_empty_host_takes_the_default_when_one_is_given() -> None:
    assert parse_listen(":9700", example="127.0.0.1:9700", default_host="127.0.0.1") == ("127.0.0.1", 9700)


def test_url_host_brackets_ipv6_only() -> None:
    assert (url_host("::1"), url_host("127.0.0.1"), url_host("example")) == ("[::1]", "127.0.0.1", "example")

"""``limit`` and ``continue`` of a paged list route, and its answer: ``{"items": [...]}``, with
``"continue": TOKEN`` when more follow (see :mod:`nymph.queue.paging`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from nymph.queue.paging import Page, PageRequest, decode_token, encode_token, parse_limit


@dataclass(frozen=True)
class Listing:
    """One paged list as a route serves it: its name, the filters of this request (the scope
    in the route and the query's filters, which a ``continue`` token is bound to) and how many
    columns its sort key has."""

    name: str
    filters: tuple[str | None, ...]
    arity: int

    def request(self, request: web.Request) -> PageRequest:
        """The page asked for; BadRequest naming ``limit`` or ``continue`` when one is wrong."""
        limit = parse_limit(request.query.get("limit"))
        token = request.query.get("continue") or None
        if token is None:
            return PageRequest(limit=limit)
        return PageRequest(
            limit=limit, after=decode_token(token, listing=self.name, filters=self.filters, arity=self.arity)
        )

    def answer(self, page: Page[Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"items": page.items}
        if page.next_key is not None:
            body["continue"] = encode_token(listing=self.name, filters=self.filters, key=page.next_key)
        return body


def listing(name: str, *filters: str | None, arity: int = 1) -> Listing:
    return Listing(name=name, filters=tuple(filters), arity=arity)

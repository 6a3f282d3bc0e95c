"""The console's security rules as plain data and pure functions: the headers on every answer,
the session cookie's attributes and the CSRF tokens of its forms.

The session cookie holds the token itself (so any replica can check it, as for the API): it
is ``HttpOnly``, ``SameSite=Strict``, ``Secure`` over TLS and has no ``Max-Age``, so it lasts
the browser session only. A form that changes state carries a CSRF token derived from the
session's token (an HMAC, so it reveals nothing of it); the sign-in form, before any session,
carries the value of a random pre-session cookie (double submit).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SESSION_COOKIE = "nymph_console"
PRESESSION_COOKIE = "nymph_console_pre"
CSRF_FIELD = "csrf"

#: No inline script or style, no other origin, no framing: on every console answer.
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    )
)

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


#: Both console cookies are sent back on the console's paths only.
COOKIE_PATH = "/console"


def csrf_token(session_token: str) -> str:
    """The CSRF token of a signed-in session's forms."""
    key = session_token.encode("utf-8", errors="surrogatepass")
    return hmac.new(key, b"nymph-console-csrf", hashlib.sha256).hexdigest()


def csrf_matches(*, expected: str, sent: object) -> bool:
    return isinstance(sent, str) and bool(expected) and hmac.compare_digest(expected, sent)


def new_presession() -> str:
    return secrets.token_urlsafe(24)

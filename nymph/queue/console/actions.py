"""The console's forms and the answers its pages fetch: sign in and out, launch, stop, and the
log, instance and result routes (the API's own handlers, behind the console's cookie).

Every form that changes state is checked for its CSRF token (and, when the browser sends one,
an ``Origin`` of this host) before anything else; a launch refused by the queue shows the
API's own words next to the field they are about.
"""

from __future__ import annotations

import structlog
from aiohttp import web

from nymph.queue.console import pages, security
from nymph.queue.console.guard import SIGN_IN, principal_for
from nymph.queue.console.keys import CSRF
from nymph.queue.console.pages import INSTANCE, NS, instances_page
from nymph.queue.console.views import over_tls, page, see_other, set_cookie
from nymph.queue.direct.wiring import DISPATCHERS
from nymph.queue.errors import Forbidden, ServiceError
from nymph.queue.http.keys import PRINCIPAL
from nymph.queue.http.routes import output as output_routes
from nymph.queue.http.routes import results as result_routes
from nymph.queue.http.routes import user as user_routes

log = structlog.get_logger(__name__, component="queue.console")
routes = web.RouteTableDef()
#: The launch form's fields, where a refusal is shown (else above the form).
FIELDS = ("script", "mode", "tags")


def _same_origin(request: web.Request) -> None:
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        raise Forbidden("this form was sent from another site", code="csrf")


async def _form(request: web.Request, *, expected: str) -> dict[str, str]:
    """The form's fields, once its origin and CSRF token are checked."""
    _same_origin(request)
    data = await request.post()
    if not security.csrf_matches(expected=expected, sent=data.get(security.CSRF_FIELD)):
        raise Forbidden("this form's CSRF token is missing or stale: reload the page", code="csrf")
    fields: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, str):
            fields[key] = value
        elif isinstance(value, web.FileField) and value.filename:  # a script given as a file
            fields[key] = value.file.read().decode("utf-8", errors="replace")
    return fields


def sign_in_page(request: web.Request, *, error: str | None = None, status: int = 200) -> web.Response:
    pre = security.new_presession()
    answer = page(request, "signin.html", status=status, presession=pre, error=error)
    set_cookie(answer, security.PRESESSION_COOKIE, pre, secure=over_tls(request))
    return answer


async def home(request: web.Request) -> web.Response:
    if PRINCIPAL not in request:
        return sign_in_page(request)
    return await pages.home(request)


async def bare(request: web.Request) -> web.Response:
    """``/console`` (on the queue's own app, before the console's prefix takes it)."""
    answer = see_other(SIGN_IN)
    answer.headers.update(security.SECURITY_HEADERS)
    return answer


@routes.post("/signin", name="signin")
async def sign_in(request: web.Request) -> web.Response:
    data = await _form(request, expected=request.cookies.get(security.PRESESSION_COOKIE, ""))
    token = data.get("token", "").strip()
    if not token:
        return sign_in_page(request, error="paste a user or admin token", status=400)
    found = await principal_for(request, token)
    if found is None:
        log.warning("console sign-in refused", peer=request.remote)
        return sign_in_page(
            request, error="this token is not a user or admin token of this queue", status=401
        )
    log.info("console sign-in", token_id=found.token_id, role=found.role.value)
    answer = see_other(SIGN_IN)
    set_cookie(answer, security.SESSION_COOKIE, token, secure=over_tls(request))
    answer.del_cookie(security.PRESESSION_COOKIE, path=security.COOKIE_PATH)
    return answer


@routes.post("/signout", name="signout")
async def sign_out(request: web.Request) -> web.Response:
    await _form(request, expected=request[CSRF])
    answer = see_other(SIGN_IN)
    answer.del_cookie(security.SESSION_COOKIE, path=security.COOKIE_PATH)
    return answer


def parse_tags(text: str) -> dict[str, str]:
    """``key=value`` per line (blank lines skipped); a ValueError names a line without ``=``."""
    tags: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"line {number}: write each tag as key=value")
        tags[key.strip()] = value.strip()
    return tags


def field_of(detail: str) -> str:
    """Which launch form field a refusal is about (``form`` when none)."""
    lowered = detail.lower()
    for name, words in (("tags", ("tag", "label")), ("mode", ("mode",)), ("script", ("script",))):
        if any(w in lowered for w in words):
            return name
    return "form"


@routes.post(NS + "/providers/{name}/launch", name="launch")
async def launch(request: web.Request) -> web.Response:
    m = request.match_info
    data = await _form(request, expected=request[CSRF])
    form = {k: data.get(k, "") for k in FIELDS}
    if data.get("script_file"):
        form["script"] = data["script_file"]
    try:
        tags = parse_tags(form["tags"])
    except ValueError as exc:
        return await instances_page(request, form=form, errors={"tags": str(exc)})
    body = {"mode": form["mode"], "script": form["script"].replace("\r\n", "\n"), "tags": tags}
    try:
        accepted = await request.config_dict[DISPATCHERS].launch(
            ns=m["ns"], provider=m["name"], body=body, idempotency_key=None, principal=request[PRINCIPAL]
        )
    except ServiceError as exc:
        if exc.status >= 500:
            raise
        return await instances_page(request, form=form, errors={field_of(exc.detail): exc.detail})
    return see_other(f"/console/ns/{m['ns']}/providers/{m['name']}/instances/{accepted['instanceId']}")


@routes.post(INSTANCE + "/stop", name="stop")
async def stop(request: web.Request) -> web.Response:
    m = request.match_info
    await _form(request, expected=request[CSRF])
    dispatcher = await request.config_dict[DISPATCHERS].for_instance(instance_id=m["id"])
    await dispatcher.stop(
        ns=m["ns"], provider=m["name"], instance_id=m["id"], grace=None, principal=request[PRINCIPAL]
    )
    return see_other(f"/console/ns/{m['ns']}/providers/{m['name']}/instances/{m['id']}")


@routes.get(INSTANCE + "/log.txt", name="log-file")
async def log_file(request: web.Request) -> web.StreamResponse:
    """The whole log stored so far, as text (the API's own answer to ``Accept: text/plain``)."""
    plain = request.clone(
        headers={**request.headers, "Accept": "text/plain"},
        rel_url=request.rel_url.with_query({"follow": "false"}),
    )
    return await output_routes.get_logs(plain)


# The API's own handlers (they read the same match_info names), behind the console's cookie.
routes.get(INSTANCE + "/log", name="log-text")(output_routes.get_logs)
routes.get(INSTANCE + "/instance.json", name="instance-json")(user_routes.get_instance)
routes.get(INSTANCE + "/results/{path:.+}", name="result")(result_routes.get_result)

"""Result routes: the files a job wrote under ``/workdir/out/``, uploaded by its daemon when it
finished (``POST /v1/dispatch/results``, in chunks), listed and downloaded by users
(``GET .../instances/{id}/results`` and ``.../results/{path}``)."""

from __future__ import annotations

import base64
import binascii

from aiohttp import web

from nymph.launch.results import BadResultPath, check_result_path
from nymph.queue.errors import BadRequest, Unprocessable
from nymph.queue.http.answers import json_response
from nymph.queue.http.bodies import Fields, read_object
from nymph.queue.http.caller import daemon_session
from nymph.queue.http.keys import STORE
from nymph.queue.http.routes.refusals import logged_refusal

routes = web.RouteTableDef()
NS = "/v1/namespaces/{ns}"
_MAX_CHUNK = 512 * 1024


@routes.get(NS + "/providers/{name}/instances/{id}/results")
async def list_results(request: web.Request) -> web.Response:
    m = request.match_info
    body = await request.app[STORE].output.results(ns=m["ns"], provider=m["name"], instance_id=m["id"])
    return json_response(body)


@routes.get(NS + "/providers/{name}/instances/{id}/results/{path:.+}")
async def get_result(request: web.Request) -> web.StreamResponse:
    m = request.match_info
    try:
        path = check_result_path(m["path"])
    except BadResultPath as exc:
        raise BadRequest(str(exc), code="invalid_path") from None
    output = request.app[STORE].output
    size = await output.result_size(ns=m["ns"], provider=m["name"], instance_id=m["id"], path=path)
    resp = web.StreamResponse(headers={"Content-Length": str(size)})
    resp.content_type = "application/octet-stream"
    await resp.prepare(request)
    pos = 0
    while pos < size:
        pieces = await output.result_chunks(instance_id=m["id"], path=path, since=pos)
        if not pieces:
            break
        for piece in pieces:
            await resp.write(piece)
            pos += len(piece)
    await resp.write_eof()
    return resp


@routes.post("/v1/dispatch/results")
async def put_result(request: web.Request) -> web.Response:
    f = Fields(await read_object(request))
    f.reject_unknown({"daemonId", "instanceId", "path", "offset", "data", "eof", "error"})
    session = daemon_session(request, f, refuse_empty=False)
    path = f.string("path", required=False, max_len=1024)
    if path is not None:
        try:
            check_result_path(path)
        except BadResultPath as exc:
            raise Unprocessable(f"body.path: {exc}") from None
    try:
        data = base64.b64decode(f.text("data", required=False) or "", validate=True)
    except (binascii.Error, ValueError):
        raise Unprocessable("body.data must be base64") from None
    if len(data) > _MAX_CHUNK:
        raise Unprocessable(f"body.data holds more than {_MAX_CHUNK} bytes: send smaller chunks")
    instance_id = f.req_string("instanceId")
    offset = f.integer("offset", default=0, minimum=0, maximum=2**62)
    eof = f.boolean("eof", default=False)
    error = f.string("error", required=False, max_len=2000)
    with logged_refusal(session=session, route="results"):
        size = await request.app[STORE].output.put_result(
            session=session,
            instance_id=instance_id,
            path=path,
            offset=offset,
            data=data,
            eof=eof,
            error=error,
        )
    return json_response({"size": size})

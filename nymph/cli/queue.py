"""``nymph queue serve`` and ``nymph queue token create``; the user verbs over the API
(:mod:`nymph.cli.user`) are registered from here, right after ``queue``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import platformdirs

from nymph import eventloop  # imports asyncio only when a loop is made
from nymph.cli import user
from nymph.cli.queueflags import _ns_map, _size, kubeconfig_dirs, tenancy_settings
from nymph.errors import ConfigError
from nymph.netaddr import DEFAULT_LISTEN, parse_listen

# The queue server is imported by the commands that run it, not to build the parser.
if TYPE_CHECKING:
    from nymph.queue.sql.dialect import Conn

__all__ = ["DB_URL_ENV", "ROLES", "_ns_map", "_size", "kubeconfig_dirs", "register", "tenancy_settings"]

T = TypeVar("T")
DB_URL_ENV = "NYMPH_DB_URL"
#: The token roles (``nymph.queue.models.Role``), for the parser.
ROLES = ("user", "daemon", "admin")


def default_db_path() -> Path:
    """The queue's default SQLite file (as ``nymph.queue.http.serve.default_db_path``)."""
    return platformdirs.user_data_path("nymph") / "queue.db"


def _is_url(text: str) -> bool:
    return text.startswith(("postgresql://", "postgres://"))


def _db_path(args: argparse.Namespace) -> Path | str:
    """``--db``, else ``$NYMPH_DB_URL``, else the default SQLite file: a PostgreSQL URL as it is,
    a SQLite path (or ``sqlite:///PATH``) as a path."""
    text = args.db or os.environ.get(DB_URL_ENV) or ""
    if not text:
        return default_db_path()
    if _is_url(text):
        return text
    if text.startswith("sqlite:///"):
        text = text[len("sqlite:///") :]
    return Path(text).expanduser()


def _write_once(target: Path | str, fn: Callable[[Conn], T]) -> T:
    from nymph.queue.db import connect, transaction

    if isinstance(target, str):
        from nymph.queue.pgdb import write_once

        return write_once(target, fn)
    conn = connect(target)
    try:
        with transaction(conn, write=True):
            return fn(conn)
    finally:
        conn.close()


def _where(target: Path | str) -> str:
    if isinstance(target, str):
        from nymph.queue.pgdb import describe

        return describe(target)
    return str(target)


def _import_tokens(path: Path | str, specs: list[str]) -> None:
    """``--import-token ROLE:FILE``: make the token in FILE (e.g. a mounted Secret) valid."""
    from nymph.queue.auth import import_token
    from nymph.queue.models import Role

    for spec in specs:
        role_text, sep, file = spec.partition(":")
        if not sep or role_text not in [r.value for r in Role] or not file:
            raise ConfigError(f"--import-token {spec!r}: expected ROLE:FILE with ROLE user or daemon")
        try:
            token = Path(file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"--import-token: cannot read {file} ({exc.__class__.__name__})") from None
        try:
            _write_once(path, lambda conn: import_token(conn, token=token, role=Role(role_text)))  # noqa: B023
        except ValueError as exc:
            raise ConfigError(f"--import-token {file}: {exc}") from None


def cmd_serve(args: argparse.Namespace) -> int:
    from nymph.kube.netguard import ServerPolicy
    from nymph.launch.durations import parse_duration
    from nymph.queue.direct.settings import DirectSettings
    from nymph.queue.http.serve import serve
    from nymph.queue.models import LaunchSettings, LeaseSettings, OutputSettings, QueueSettings, RetrySettings

    host, port = parse_listen(args.listen, example=DEFAULT_LISTEN)
    bare_dirs, team_dirs = kubeconfig_dirs(args.kubeconfig_dir)
    try:
        ServerPolicy.from_allow(args.kube_server_allow)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _import_tokens(_db_path(args), args.import_token)
    settings = QueueSettings(
        lease=LeaseSettings(sweep_interval=args.sweep_interval, stop_node_fallback=args.stop_node_fallback),
        retry=RetrySettings(max_attempts=args.max_attempts, backoff_base=args.backoff_base),
        direct=DirectSettings(
            kubeconfig_dirs=bare_dirs,
            team_kubeconfig_dirs=team_dirs,
            kube_server_allow=tuple(args.kube_server_allow),
            allow_insecure_tls=args.allow_insecure_tls,
            ambient=args.ambient_kubeconfig,
            secret_key_file=Path(args.secret_key_file).expanduser() if args.secret_key_file else None,
            reap_after=args.reap_after,
        ),
        tenancy=tenancy_settings(args),
        output=OutputSettings(
            log_cap_bytes=_size(args.log_cap, "--log-cap"),
            results_cap_bytes=_size(args.results_cap, "--results-cap"),
            retention_seconds=args.retention_days * 86_400.0,
        ),
        launch=LaunchSettings(
            image_pull_timeout=parse_duration(args.image_pull_timeout, "--image-pull-timeout"),
        ),
    )
    eventloop.run(serve(db_path=_db_path(args), host=host, port=port, settings=settings))
    return 0


def cmd_token_create(args: argparse.Namespace) -> int:
    from nymph.queue.auth import create_token
    from nymph.queue.models import Role

    if args.role == Role.ADMIN.value and args.namespace:
        print("nymph: an admin token is for every namespace: leave out --namespace", file=sys.stderr)
        return 2
    path = _db_path(args)
    created = _write_once(
        path, lambda conn: create_token(conn, role=Role(args.role), namespace=args.namespace, name=args.name)
    )
    scope = f"namespace {created.namespace}" if created.namespace else "all namespaces"
    print(f"created {created.role.value} token {created.token_id} for {scope} in {_where(path)}")
    print("it is shown only this once; the queue stores only its hash")
    print(f"token: {created.token}")
    return 0


def register(sub: Any) -> None:
    queue = sub.add_parser(
        "queue",
        help="run the control-plane queue, manage its tokens",
        description="The control-plane queue: users send launches, daemons claim them.",
    )
    qsub = queue.add_subparsers(dest="queue_command", metavar="COMMAND", required=True)

    db_help = (
        f"SQLite file or sqlite:///PATH (default: ${DB_URL_ENV}, else {default_db_path()}), or a "
        "postgresql://USER@HOST/DB URL for several queue replicas on one PostgreSQL database"
    )
    p = qsub.add_parser(
        "serve",
        help="serve the queue API",
        description="Serve the queue API until SIGTERM or SIGINT. Example: "
        "nymph queue serve --db /var/lib/nymph/queue.db --listen 0.0.0.0:8700. " + eventloop.HELP,
    )
    p.add_argument("--db", help=db_help)
    p.add_argument(
        "--listen", default=DEFAULT_LISTEN, help=f"HOST:PORT (default {DEFAULT_LISTEN}; port 0 picks one)"
    )
    p.add_argument(
        "--import-token",
        action="append",
        default=[],
        metavar="ROLE:FILE",
        help="make the token in FILE valid for ROLE (user or daemon), e.g. a mounted Secret; repeatable",
    )
    p.add_argument("--max-attempts", type=int, default=5, help="tries per task before it fails (default 5)")
    p.add_argument(
        "--backoff-base",
        type=float,
        default=2.0,
        help="first retry delay in seconds, doubled per try (default 2)",
    )
    p.add_argument(
        "--sweep-interval", type=float, default=5.0, help="seconds between expired-lease sweeps (default 5)"
    )
    p.add_argument(
        "--stop-node-fallback",
        type=float,
        default=30.0,
        help="seconds a stop task waits for the instance's node before any daemon may take it (default 30)",
    )
    g = p.add_argument_group("direct dispatch and secrets")
    g.add_argument(
        "--secret-key-file",
        metavar="FILE",
        help="key of the secret store (e.g. a mounted Secret; must exist). Default: a file "
        "beside the database, created 0600 on first use (a single local queue)",
    )
    g.add_argument(
        "--kubeconfig-dir",
        action="append",
        default=[],
        metavar="[NS=]DIR",
        help="a directory path kubeconfigs of direct providers may be read from (symlinks "
        "resolved; repeatable): NS=DIR serves control-plane namespace NS only, a bare DIR only "
        "tokens not scoped to a namespace. With none, path kubeconfigs are refused. These are "
        "the operator's files and keep kubectl's full semantics (exec plugins, file paths)",
    )
    g.add_argument(
        "--kube-server-allow",
        action="append",
        default=[],
        metavar="HOST|CIDR",
        help="a server a user-supplied (inline or secret) kubeconfig may connect to (repeatable); "
        "when given, only these. Default: any but loopback, link-local (cloud metadata), "
        "unspecified and this host's own addresses, checked on what a name resolves to",
    )
    g.add_argument(
        "--allow-insecure-tls",
        action="store_true",
        help="let a user-supplied kubeconfig say insecure-skip-tls-verify (default: refused)",
    )
    g.add_argument(
        "--ambient-kubeconfig",
        action="store_true",
        help="let a direct provider without a kubeconfig use this host's own credentials "
        "(KUBECONFIG, ~/.kube/config or the in-cluster ServiceAccount): only for a single "
        "user, as any user token could then act with the queue's identity",
    )
    g.add_argument(
        "--reap-after",
        type=float,
        default=600.0,
        help="seconds after a direct Pod ends before it is deleted, its log tail kept (default 600)",
    )
    t = p.add_argument_group(
        "teams sharing a cluster",
        "What a namespace-scoped token may reach in the cluster (unscoped tokens may reach "
        "any Kubernetes namespace; ServiceAccounts and replica caps apply to every token).",
    )
    t.add_argument(
        "--kube-namespaces",
        action="append",
        default=[],
        metavar="NS=K1,K2",
        help="the Kubernetes namespaces control-plane namespace NS may launch into (repeatable; "
        "default: only the one of the same name)",
    )
    t.add_argument(
        "--service-account",
        action="append",
        default=[],
        metavar="NS=NAME",
        help="a ServiceAccount launches of control-plane namespace NS may run as (repeatable). "
        "With none, a mode or launch naming service_account is refused",
    )
    t.add_argument(
        "--max-replicas",
        type=int,
        default=64,
        metavar="N",
        help="the most worker replicas one dockyard launch may ask for (default 64)",
    )
    t.add_argument(
        "--max-pod-request",
        action="append",
        default=[],
        metavar="RESOURCE=QUANTITY",
        help="the most of a resource one pod of a dockyard launch may request, e.g. cpu=64, "
        "memory=512Gi, nvidia.com/gpu=8 (repeatable; default: no cap)",
    )
    o = p.add_argument_group("logs and results")
    o.add_argument(
        "--log-cap",
        default="8MiB",
        metavar="SIZE",
        help="log bytes kept per instance (default 8MiB); beyond it the oldest middle part is "
        "dropped and a marker says how many bytes",
    )
    o.add_argument(
        "--results-cap",
        default="64MiB",
        metavar="SIZE",
        help="result bytes kept per instance (default 64MiB)",
    )
    o.add_argument(
        "--retention-days",
        type=float,
        default=7.0,
        help="days a stopped instance is kept, with its logs and results (default 7); then the "
        "sweeper deletes it, and its id answers 404 instance_expired",
    )
    p.add_argument(
        "--image-pull-timeout",
        default="2m",
        metavar="DURATION",
        help="how long a launch's image may fail to pull (ErrImagePull, ImagePullBackOff) before "
        "its Pod is deleted and it ends stopped / ImagePull: seconds or 90s, 5m, 1h (default 2m); "
        "a mode's image_pull_timeout field wins",
    )
    p.set_defaults(func=cmd_serve)

    token = qsub.add_parser("token", help="manage API tokens")
    tsub = token.add_subparsers(dest="token_command", metavar="COMMAND", required=True)
    p = tsub.add_parser(
        "create",
        help="create a bearer token (printed once, as the last word)",
        description="Create a token for users (providers, modes, launches), daemons (the "
        "dispatch API) or admins (every user route in every namespace, and the only role that "
        "may set a namespace's quota: nymph quota set). Example: nymph queue token create "
        "--role daemon --namespace team-a",
    )
    p.add_argument("--db", help=db_help)
    p.add_argument("--role", required=True, choices=ROLES)
    p.add_argument("--namespace", help="limit the token to this namespace (default: all)")
    p.add_argument("--name", help="a label recorded as the requester of launches")
    p.set_defaults(func=cmd_token_create)

    user.register(sub)

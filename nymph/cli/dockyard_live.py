"""The live ``nymph dockyard`` verbs: run, cluster up|down|list, status, logs, job, doctor.

Each handler loads and renders like ``render`` does, then runs one coroutine of
:mod:`nymph.dockyard.live.run`, :mod:`nymph.dockyard.live.observe` or :mod:`nymph.dockyard.live.doctor`
against the kube context named by ``--kubeconfig`` / ``--context`` (default: the current
one). Failures are one line on stderr and exit code 2 (raised as ``NymphError``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nymph.cli import dockyard_dev, dockyard_jobs
from nymph.dockyard.errors import DockyardLiveError
from nymph.dockyard.spec.enums import CodeSource, RunMode, SubmitterMode

# The live path (kubectl, the Ray Jobs client, the spec models) is imported by the verbs that
# run, not to build the parser.
if TYPE_CHECKING:
    from nymph.dockyard.live import run
    from nymph.dockyard.live.kubectl import Kube
    from nymph.dockyard.spec.load import Environment, LoadedConfig

#: ``nymph.dockyard.render.plan.LogSource`` values, for the parser.
LOG_SOURCES = ("head", "worker", "sandbox")

Loader = Callable[..., "tuple[LoadedConfig, list[Any]]"]
BRINGUP = "infra.launch.mode=bringup"


def _say(line: str) -> None:
    from nymph.dockyard.live.kubectl import say

    say(line)


def _kube(args: argparse.Namespace) -> Kube:
    from nymph.dockyard.live.kubectl import Kube

    return Kube.connect(kubeconfig=args.kubeconfig, context=args.context)


def _environment(args: argparse.Namespace) -> Environment:
    from nymph.dockyard.spec.load import Environment

    env = Environment.from_process()
    if args.kubeconfig or args.context:
        env = dataclasses.replace(
            env,
            kubeconfigs=(Path(args.kubeconfig),) if args.kubeconfig else None,
            context=args.context,
        )
    return env


def _namespace(args: argparse.Namespace) -> str:
    if args.namespace:
        return str(args.namespace)
    from nymph.dockyard.spec import kubecontext

    env = _environment(args)
    choice = kubecontext.infer_namespace(
        kubeconfigs=env.kubeconfig_paths(), sa_namespace_path=env.sa_namespace_path, context=env.context
    )
    return choice.namespace


def _options(args: argparse.Namespace) -> run.LiveOptions:
    from nymph.dockyard.live import run
    from nymph.dockyard.render.runopts import RunFlags
    from nymph.dockyard.spec.load import Environment

    wait = getattr(args, "wait", None)
    flags = RunFlags(
        mode=_enum(RunMode, getattr(args, "mode", None)),
        submitter=_enum(SubmitterMode, getattr(args, "submitter", None)),
        code_source=_enum(CodeSource, getattr(args, "code_source", None)),
        code_path=getattr(args, "code_path", None),
        wait=wait,
        run_id=getattr(args, "run_id", None),
    )
    return run.LiveOptions(
        kubeconfig=args.kubeconfig,
        context=args.context,
        ray_address=getattr(args, "ray_address", None),
        no_wait=bool(getattr(args, "no_wait", False)) or wait is False,
        dry_run=bool(getattr(args, "dry_run", False)),
        timeout=getattr(args, "timeout", None),
        poll=float(getattr(args, "poll", 2.0)),
        flags=flags,
        replace=bool(getattr(args, "replace", False)),
        recreate=bool(getattr(args, "recreate", False)),
        repo_root=Path(getattr(args, "repo_root", None) or Path.cwd()),
        user=Environment.from_process().user,
        rayjob_name=getattr(args, "rayjob_name", None),
        shutdown=bool(getattr(args, "shutdown", True)),
        ttl=getattr(args, "ttl", None),
    )


def _enum(cls: Any, value: str | None) -> Any:
    return cls(value) if value else None


def _go(coro: Coroutine[Any, Any, int]) -> int:
    return asyncio.run(coro)


def register(
    verbs: Any,
    *,
    common: Callable[[argparse.ArgumentParser], None],
    load: Loader,
    parser_class: type[argparse.ArgumentParser],
) -> None:
    def loaded(args: argparse.Namespace, *extra: str) -> tuple[LoadedConfig, list[Any]]:
        return load(args, extra_overrides=extra, environment=_environment(args))

    def cmd_run(args: argparse.Namespace) -> int:
        from nymph.dockyard.live import run

        cfg, manifests = loaded(args)
        return _go(run.run(_kube(args), cfg, manifests, opts=_options(args), say=_say))

    def cmd_cluster_up(args: argparse.Namespace) -> int:
        from nymph.dockyard.live import run

        cfg, manifests = loaded(args, BRINGUP)
        return _go(run.cluster_up(_kube(args), cfg, manifests, opts=_options(args), say=_say))

    def cmd_cluster_down(args: argparse.Namespace) -> int:
        from nymph.dockyard.live import run

        cfg, manifests = loaded(args, BRINGUP)
        return _go(run.cluster_down(_kube(args), cfg, manifests, opts=_options(args), say=_say))

    def cmd_cluster_list(args: argparse.Namespace) -> int:
        from nymph.dockyard.live import observe

        ns = None if args.all_namespaces else _namespace(args)
        return _go(observe.cluster_list(_kube(args), namespace=ns, say=_say))

    def cmd_status(args: argparse.Namespace) -> int:
        from nymph.dockyard.live import observe

        cfg, manifests = loaded(args)
        return _go(observe.show_status(_kube(args), cfg, manifests, say=_say))

    def cmd_logs(args: argparse.Namespace) -> int:
        from nymph.dockyard.live import observe
        from nymph.dockyard.render.plan import LogSource

        cfg, manifests = loaded(args)
        opts = observe.LogOptions(
            source=LogSource(args.source),
            follow=args.follow,
            tail=args.tail,
            group=args.group,
            container=args.container,
        )
        return _go(observe.logs(_kube(args), cfg, manifests, opts=opts, say=_stderr_say))

    def cmd_doctor(args: argparse.Namespace) -> int:
        from nymph.dockyard.live import doctor

        infra = None
        if args.recipe:
            cfg, _ = loaded(args)
            infra = cfg.infra
            namespace = args.namespace or infra.namespace
        else:
            if args.overrides:
                raise DockyardLiveError(
                    "overrides need a RECIPE: nymph dockyard doctor RECIPE [--infra F] KEY=VALUE"
                )
            namespace = _namespace(args)
        return _go(doctor.doctor(_kube(args), namespace=namespace, infra=infra, say=_say))

    # -- parsers ---------------------------------------------------------------------------

    r = verbs.add_parser(
        "run",
        help="apply and launch: rayjob (follow the RayJob), bringup or attach (submit the entrypoint)",
        description="Launch a recipe. rayjob mode: server-side apply the sandbox pool, then the "
        "RayJob, and follow it to a terminal state (exit 0 only if it succeeded). bringup: ensure "
        "the pool and the RayCluster, wait for the head, submit launch.entrypoint through the Ray "
        "Jobs REST API and follow the job. attach: submit to the RayCluster named by "
        "launch.attach. ResourceQuota / LimitRange are never applied.",
    )
    common(r)
    _kube_args(r)
    _wait_args(r)
    _ray_address(r)
    r.add_argument(
        "--dry-run", action="store_true", help="server-side dry run of every manifest; change nothing"
    )
    _run_args(r)
    r.set_defaults(func=cmd_run)

    c = verbs.add_parser("cluster", help="bring a RayCluster and its sandbox pool up or down; list clusters")
    cverbs = c.add_subparsers(dest="cluster_command", metavar="VERB", parser_class=parser_class)
    c.set_defaults(func=lambda _a: _usage(c))
    up = cverbs.add_parser(
        "up",
        help="apply the sandbox pool (NetworkPolicy, PDB), PDBs and the RayCluster; wait until ready",
        description="Render in bringup mode and server-side apply the sandbox pool (Deployment, "
        "Service, NetworkPolicy, PDB), the cluster PDB and the RayCluster, then wait for the pool "
        "and the cluster to be ready. ResourceQuota / LimitRange are never applied.",
    )
    common(up)
    _kube_args(up)
    _wait_args(up)
    up.add_argument("--dry-run", action="store_true", help="server-side dry run; change nothing")
    up.add_argument(
        "--recreate",
        action="store_true",
        help="delete and re-create a RayCluster that differs from the infra",
    )
    up.set_defaults(func=cmd_cluster_up)
    down = cverbs.add_parser(
        "down",
        help="delete the RayCluster (and a RayJob of its name), PDBs and the sandbox pool",
        description="Delete what 'cluster up' and 'run' apply for this recipe, last applied first: "
        "a RayJob of the cluster's name, the RayCluster, the PDBs, the NetworkPolicy, the Service "
        "and the Deployment. ResourceQuota / LimitRange are never touched.",
    )
    common(down)
    _kube_args(down)
    down.add_argument("--no-wait", action="store_true", help="do not wait until the objects are gone")
    down.add_argument("--timeout", type=float, metavar="SECONDS", help="how long to wait (default 120)")
    down.add_argument("--dry-run", action="store_true", help="only say what would be deleted")
    down.set_defaults(func=cmd_cluster_down)
    ls = cverbs.add_parser("list", help="list RayClusters and dockyard sandbox pools")
    _kube_args(ls)
    _namespace_arg(ls)
    ls.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    ls.set_defaults(func=cmd_cluster_list)

    s = verbs.add_parser(
        "status",
        help="the live state of every object of a recipe (exit 1 if any is absent)",
    )
    common(s)
    _kube_args(s)
    s.set_defaults(func=cmd_status)

    lg = verbs.add_parser("logs", help="logs of the head, the workers or the sandbox pool (kubectl logs)")
    common(lg)
    _kube_args(lg)
    lg.add_argument("--source", choices=LOG_SOURCES, default="head", help="whose logs (default head)")
    lg.add_argument("-f", "--follow", action="store_true", help="stream new lines")
    lg.add_argument("--tail", type=int, default=200, help="lines per pod to start with (default 200)")
    lg.add_argument("--group", help="only this worker group (with --source worker)")
    lg.add_argument("-c", "--container", help="container (default: the pod's first)")
    lg.set_defaults(func=cmd_logs)

    dockyard_jobs.register(
        verbs,
        load=lambda a, outer: load(a, extra_overrides=(), environment=_environment(outer)),
        kube=_kube,
        namespace=_namespace,
        parser_class=parser_class,
        go=_go,
        stderr_say=_stderr_say,
    )
    dockyard_dev.register(
        verbs,
        cverbs,
        kube=_kube,
        namespace=_namespace,
        user=_user,
        parser_class=parser_class,
        go=_go,
        kube_args=_kube_args,
    )

    d = verbs.add_parser(
        "doctor",
        help="check the kube context: reachable, authorised, KubeRay CRDs, PriorityClass",
        description="Check that this kube context can run dockyard: kubectl reaches the API server, "
        "you may do what the live commands do in the namespace, the KubeRay CRDs are installed, "
        "and (with a RECIPE) the PriorityClass and ServiceAccount it names exist. Exit 1 if a "
        "check fails.",
    )
    d.add_argument("recipe", nargs="?", help="recipe YAML (optional: adds the checks of its infra)")
    d.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides (with a RECIPE)")
    d.add_argument("--infra", metavar="FILE", help="infra YAML")
    _kube_args(d)
    _namespace_arg(d)
    d.set_defaults(func=cmd_doctor)


def render_dry_run(args: argparse.Namespace, *, load: Loader) -> int:
    """``render --dry-run``: every rendered object through a server-side dry run."""
    from nymph.dockyard.live import run

    cfg, manifests = load(args, extra_overrides=(), environment=_environment(args))
    return _go(run.dry_run_all(_kube(args), manifests, namespace=cfg.infra.namespace, say=_say))


def _user() -> str:
    from nymph.dockyard.spec.load import Environment

    return Environment.from_process().user


def _stderr_say(line: str) -> None:
    """Progress for verbs whose stdout is data (logs, job output)."""
    print(line, file=sys.stderr, flush=True)


def _kube_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: KUBECONFIG or ~/.kube/config)")
    p.add_argument("--context", help="kube context (default: the current one)")


def _namespace_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--namespace", help="namespace (default: the kube context's, else default)")


def _wait_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="--no-wait: return once applied / submitted, do not wait for the pool or follow the job "
        "(default: wait, except 'run' in batch mode)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="give up waiting after this long (default: sandbox.healthCheckTimeoutS for the pool, "
        "900 for 'cluster up', 1800 for the head of 'run', 86400 when following a RayJob, no limit "
        "when following a Ray job)",
    )
    p.add_argument("--poll", type=float, default=2.0, help=argparse.SUPPRESS)


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mode",
        choices=[m.value for m in RunMode],
        help="interactive: port-forward + upload + follow; batch: exec + code in the image + no wait "
        "(default: infra.launch.runMode)",
    )
    p.add_argument(
        "--submitter", choices=[m.value for m in SubmitterMode], help="how the entrypoint is started"
    )
    p.add_argument("--code-source", choices=[m.value for m in CodeSource], help="where the code comes from")
    p.add_argument("--code-path", metavar="PATH", help="the code's directory in the pod (image / lustre)")
    p.add_argument(
        "--run-id", metavar="ID", help="the run's id (the Ray submission id; default <user>-<recipe>-<time>)"
    )
    p.add_argument(
        "--repo-root", metavar="DIR", help="the working dir uploaded with --code-source upload (default .)"
    )
    p.add_argument("--replace", action="store_true", help="stop the cluster's unfinished jobs first")
    p.add_argument(
        "--recreate",
        action="store_true",
        help="delete and re-create a RayCluster that differs from the infra",
    )
    p.add_argument(
        "--rayjob-name", metavar="NAME", help="rayjob mode: the RayJob's name (default kuberay.name)"
    )
    p.add_argument(
        "--shutdown",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="rayjob mode: delete the RayJob's cluster when the job ends (default: yes)",
    )
    p.add_argument(
        "--ttl", type=int, metavar="SECONDS", help="rayjob mode: keep the finished RayJob this long (3600)"
    )


def _ray_address(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ray-address",
        metavar="URL",
        help="the head's dashboard (http://HOST:8265); default: the head Service, through kubectl "
        "port-forward outside the cluster",
    )


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


__all__: Sequence[str] = ["register"]

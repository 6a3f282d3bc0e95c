"""``nymph dockyard job list|logs|stop``: Ray jobs on a head, found by recipe, run id or cluster.

The positional arguments are read by their shape: a file (``*.yaml``) is the recipe, a
``KEY=VALUE`` an override, anything else the submission (run) id. The head is, in order:
``--cluster`` / ``--ray-address``; the recipe's RayCluster (``launch.attach``, the brought-up
cluster or the RayJob's); the cluster of the cached run handle of the id. Without an id,
``logs`` and ``stop`` take the recipe's latest cached run. Runs started with the ``exec``
submitter are read and stopped on the head pod.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nymph.dockyard.errors import DockyardLiveError

# kubectl and the Ray Jobs client load when a job verb runs, not to build the parser.
if TYPE_CHECKING:
    from nymph.dockyard.live import observe
    from nymph.dockyard.live.handles import RunHandle
    from nymph.dockyard.live.kubectl import Kube, Say


def _split(args: list[str]) -> tuple[Path | None, list[str], list[str]]:
    recipe: Path | None = None
    overrides: list[str] = []
    ids: list[str] = []
    for arg in args:
        if "=" in arg or arg.startswith("~"):
            overrides.append(arg)
        elif arg.endswith((".yaml", ".yml")) or Path(arg).is_file():
            if recipe is not None:
                raise DockyardLiveError(f"two recipes given: {recipe} and {arg}")
            recipe = Path(arg)
        else:
            ids.append(arg)
    if len(ids) > 1:
        raise DockyardLiveError(f"one SUBMISSION_ID at most, got {', '.join(ids)}")
    if overrides and recipe is None:
        raise DockyardLiveError("overrides need a RECIPE: nymph dockyard job VERB [ID] RECIPE KEY=VALUE")
    return recipe, overrides, ids


async def _resolve(
    kube: Kube,
    args: argparse.Namespace,
    *,
    load: Callable[..., Any],
    namespace: Callable[[], str],
    need_id: bool,
) -> tuple[observe.JobTarget, str | None, RunHandle | None]:
    from nymph.dockyard.live import handles, observe

    recipe, overrides, ids = _split(list(args.args))
    job_id = ids[0] if ids else None
    handle = handles.load(job_id) if job_id else None
    ns: str | None = args.namespace
    cluster: str | None = args.cluster
    address: str | None = args.ray_address
    if recipe is not None:
        loaded, manifests = load(
            argparse.Namespace(recipe=str(recipe), infra=args.infra, overrides=overrides)
        )
        ns = ns or loaded.infra.namespace
        if cluster is None:
            cluster = await observe.ray_cluster_name(kube, loaded, manifests)
        if job_id is None and need_id:
            handle = handles.latest_for_recipe(recipe)
            if handle is None:
                raise DockyardLiveError(
                    f"no cached run of {recipe}: give the SUBMISSION_ID (nymph dockyard job list)"
                )
            job_id = handle.run_id
    elif handle is not None:
        ns = ns or handle.namespace
        cluster = cluster or handle.cluster
        address = address or handle.ray_address
    if job_id is None and need_id:
        raise DockyardLiveError("which job? give a SUBMISSION_ID or the RECIPE of a cached run")
    target = observe.JobTarget(
        namespace=ns or namespace(),
        cluster=cluster,
        ray_address=address,
        kubeconfig=args.kubeconfig,
        timeout=args.timeout or 120.0,
        poll=args.poll,
    )
    return target, job_id, handle


def register(verbs: Any, *, load: Callable[..., Any], kube: Callable[[argparse.Namespace], Kube],
             namespace: Callable[[argparse.Namespace], str], parser_class: type[argparse.ArgumentParser],
             go: Callable[[Any], int], stderr_say: Say) -> None:  # fmt: skip
    def resolve(args: argparse.Namespace, k: Kube, *, need_id: bool) -> Any:
        return _resolve(
            k, args, load=lambda a: load(a, args), namespace=lambda: namespace(args), need_id=need_id
        )

    async def job_list(args: argparse.Namespace) -> int:
        from nymph.dockyard.live import observe

        k = kube(args)
        target, _, _ = await resolve(args, k, need_id=False)
        return await observe.job_list(k, target, say=stderr_say)

    async def job_logs(args: argparse.Namespace) -> int:
        from nymph.dockyard.live import observe

        k = kube(args)
        target, job_id, handle = await resolve(args, k, need_id=True)
        assert job_id is not None
        if handle is not None and handle.kind == "exec":
            return await _exec_logs(k, handle, follow=args.follow, poll=args.poll)
        return await observe.job_logs(k, target, job_id, follow=args.follow, say=stderr_say)

    async def job_stop(args: argparse.Namespace) -> int:
        from nymph.dockyard.live import execrun, observe
        from nymph.dockyard.live.kubectl import say

        k = kube(args)
        target, job_id, handle = await resolve(args, k, need_id=True)
        assert job_id is not None
        if handle is not None and handle.kind == "exec":
            assert handle.pod is not None and handle.run_dir is not None
            stopped = await execrun.stop(
                k, namespace=handle.namespace, pod=handle.pod, directory=handle.run_dir, force=args.force
            )
            say(f"{'stopped' if stopped else 'already ended:'} run {job_id} on {handle.pod}")
            return 0
        wait = not (args.no_wait or args.force)
        return await observe.job_stop(k, target, job_id, wait=wait, say=say)

    j = verbs.add_parser(
        "job",
        help="Ray jobs of a recipe or a head: list, logs, stop",
        description="Ray jobs on a RayCluster's head, through the Jobs REST API (or, for runs "
        "started with --submitter exec, on the head pod). Name the head by RECIPE (its "
        "cluster), by a cached run id, or with --cluster / --ray-address.",
    )
    jverbs = j.add_subparsers(dest="job_command", metavar="VERB", parser_class=parser_class)
    j.set_defaults(func=lambda _a: (j.print_help(sys.stderr), 2)[1])
    jl = jverbs.add_parser("list", help="the jobs of the head (of RECIPE's cluster)")
    jl.add_argument("args", nargs="*", metavar="[RECIPE] [KEY=VALUE]", help="a recipe and overrides")
    jg = jverbs.add_parser("logs", help="the driver log of a job (default: RECIPE's latest run)")
    jg.add_argument("args", nargs="*", metavar="[SUBMISSION_ID] [RECIPE] [KEY=VALUE]")
    jg.add_argument("-f", "--follow", action="store_true", help="stream until the job ends")
    js = jverbs.add_parser("stop", help="stop a job (default: RECIPE's latest run)")
    js.add_argument("args", nargs="*", metavar="[SUBMISSION_ID] [RECIPE] [KEY=VALUE]")
    js.add_argument("--no-wait", action="store_true", help="do not wait until it has stopped")
    js.add_argument(
        "--force", action="store_true", help="exec runs: SIGKILL instead of SIGTERM; Ray jobs: do not wait"
    )
    jl.set_defaults(func=lambda a: go(job_list(a)))
    jg.set_defaults(func=lambda a: go(job_logs(a)))
    js.set_defaults(func=lambda a: go(job_stop(a)))
    for sub in (jl, jg, js):
        sub.add_argument("--infra", metavar="FILE", help="infra YAML (with a RECIPE)")
        sub.add_argument(
            "--kubeconfig", metavar="FILE", help="kubeconfig (default: KUBECONFIG or ~/.kube/config)"
        )
        sub.add_argument("--context", help="kube context (default: the current one)")
        sub.add_argument(
            "-n", "--namespace", help="namespace (default: the recipe's, else the kube context's)"
        )
        sub.add_argument("--cluster", metavar="NAME", help="the RayCluster whose head to use")
        sub.add_argument(
            "--ray-address",
            metavar="URL",
            help="the head's dashboard (http://HOST:8265) instead of a port-forward",
        )
        sub.add_argument(
            "--timeout", type=float, metavar="SECONDS", help="how long to wait for the head (default 120)"
        )
        sub.add_argument("--poll", type=float, default=2.0, help=argparse.SUPPRESS)


async def _exec_logs(kube: Kube, handle: RunHandle, *, follow: bool, poll: float) -> int:
    from nymph.dockyard.live import execrun

    assert handle.pod is not None and handle.run_dir is not None
    deadline = None if follow else time.monotonic()
    code = await execrun.follow(
        kube,
        namespace=handle.namespace,
        pod=handle.pod,
        directory=handle.run_dir,
        poll=poll,
        deadline=deadline,
        say=(lambda line: print(line, file=sys.stderr)) if follow else (lambda _line: None),
    )
    return 0 if (code == 0 or not follow) else 1

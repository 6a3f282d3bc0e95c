"""The runner behind ``nymph dev``: the whole path on one machine, end to end.

Starts the queue service (SQLite under a local state dir) and a daemon; uses the current kube
context when one is reachable, and otherwise starts the embedded local control plane: with a
**real node** (containerd + kubelet: the sample really runs, in the local python image, and its
output is shown) when the machine allows it, else with kwok (Pods are simulated, and it says
so). Creates a provider and a mode, submits a sample launch, shows each state change as it
happens, lists instances and verifies the audit log. Exits 0 when every step passed. With
``stay`` the queue and daemon keep running for more launches until Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from nymph.cli.devcluster import Cluster, find_cluster, server_hosts
from nymph.client import UserClient
from nymph.daemon.audit import verify
from nymph.errors import NymphError
from nymph.localcluster.cluster import free_port

SAMPLE = """\
import os, platform, time
print(f"hello from {os.environ.get('NYMPH_INSTANCE_ID')} on {platform.node()}")
print("workdir:", os.environ.get("NYMPH_WORKDIR"))
time.sleep(1)
"""


class DevError(NymphError):
    pass


def nymph_command() -> str:
    """How another shell runs this nymph: ``nymph`` when PATH finds this very executable, else
    its full path (e.g. ``.venv/bin/nymph`` of a virtualenv not on PATH), else this interpreter
    with ``-m nymph.cli``."""
    candidates = [Path(sys.argv[0]), Path(sys.executable).parent / "nymph"]
    exe = next((c for c in candidates if c.name == "nymph" and c.is_file() and os.access(c, os.X_OK)), None)
    if exe is None:
        return f"{shlex.quote(sys.executable)} -m nymph.cli"
    found = shutil.which("nymph")
    if found and Path(found).resolve() == exe.resolve():
        return "nymph"
    return shlex.quote(str(exe.absolute()))


@dataclass(frozen=True)
class DevOptions:
    """What ``nymph dev`` was asked for (see ``nymph.cli.dev`` for each option's meaning)."""

    stay: bool = False
    embedded: bool = False
    node: str | None = None
    node_kind: str = "auto"
    script: str | None = None
    port: int | None = None
    workdir_root: str | None = None
    state_dir: str | None = None


#: the steps ``nymph dev`` counts in its progress lines ("[3/7] ...")
STEPS = 7


def step(n: int, text: str, signals: Interrupts | None = None) -> None:
    """Print step ``n``'s progress line; first, an interrupt that has not taken effect does."""
    if signals is not None:
        signals.check()
    print(f"[{n}/{STEPS}] {text}", file=sys.stderr, flush=True)


@dataclass
class Procs:
    items: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def spawn(
        self, argv: list[str], *, log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        fh = log.open("ab")
        p = subprocess.Popen(
            argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        fh.close()
        self.items.append(p)
        return p

    def stop(self) -> None:
        """Stop them one by one, last started first: the daemon sends its last reports and
        releases its leases while the queue still takes them."""
        for p in reversed(self.items):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


class Interrupts:
    """Ctrl-C and SIGTERM during ``nymph dev``, by explicit handlers (a shell that starts it in
    the background leaves SIGINT ignored, and both must still stop it):

    - while it starts up and runs the demo, the first one interrupts (``KeyboardInterrupt``:
      what was started so far is stopped on the way out); inside :meth:`held` (a child being
      started and recorded) it waits for the block's end;
    - an interrupt raised where Python cannot pass it on (a fork handler of the logging module
      while a child starts prints "Exception ignored" and goes on) is raised again at the next
      :meth:`check`, which start-up calls at each step and before each process it starts;
    - while it stays up (:meth:`staying`), it ends the stay;
    - once interrupted, and while it stops (:meth:`stopping`), another one only says so: a
      second Ctrl-C never leaves things half-stopped.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.stop = threading.Event()
        #: starting -> (staying ->) stopping; "interrupted" from the first signal during start-up
        #: until the code that stops things says :meth:`stopping`
        self.phase = "starting"
        self._holding = False
        self._pending = False
        self._old = {s: signal.getsignal(s) for s in self.SIGNALS}
        for s in self.SIGNALS:
            signal.signal(s, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.phase in ("stopping", "interrupted"):
            # os.write: a handler that prints could interrupt a print of the code it stops
            os.write(2, b"      still stopping what it started; please wait\n")
            return
        self.stop.set()
        if self.phase == "starting":
            if self._holding:
                self._pending = True
                return
            self.phase = "interrupted"
            raise KeyboardInterrupt

    def check(self) -> None:
        """Raise an interrupt that came during start-up and has not taken effect: held back by
        :meth:`held`, or swallowed where it was raised (start-up would otherwise run on)."""
        if self._holding:
            return
        if self.phase == "interrupted" or (self._pending and self.phase == "starting"):
            self.phase = "interrupted"
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A block no signal interrupts (one that comes meanwhile interrupts at its end; one
        that has not taken effect yet, before it starts)."""
        self.check()
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        self.check()

    def staying(self) -> None:
        self.phase = "staying"

    def stopping(self) -> None:
        self.phase = "stopping"

    def restore(self) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)


def _wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DevError(f"{url} process exited; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=1):  # noqa: S310 - loopback only
                return
        except OSError:
            time.sleep(0.1)
    raise DevError(f"{url} did not come up in {timeout:.0f}s; see {log}")


def _token(db: Path, role: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "nymph.cli", "queue", "token", "create", "--db", str(db), "--role", role],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise DevError(f"could not create a {role} token: {out.stderr.strip()}")
    return out.stdout.strip().splitlines()[-1].split()[-1]


async def _show_output(client: UserClient, *, cluster: Cluster, instance_id: str) -> None:
    """The launch's real output, as the daemon shipped it to the queue, on stdout."""
    if cluster.simulated:
        return
    from nymph.client.logs import follow_log

    got: list[bytes] = []
    try:
        await asyncio.wait_for(
            follow_log(client, provider="dev", instance_id=instance_id, write=got.append), 30
        )
    except (TimeoutError, NymphError) as exc:
        got.append(f"(the log did not arrive in full: {exc.__class__.__name__})\n".encode())
    text = b"".join(got).decode("utf-8", errors="replace") or "(the job printed nothing)\n"
    print(f"      output of {instance_id}, printed in its container:", file=sys.stderr, flush=True)
    sys.stdout.write("".join(f"  | {line}\n" for line in text.splitlines()))
    sys.stdout.flush()


async def _demo(url: str, user_token: str, *, cluster: Cluster, script: str) -> tuple[str, int]:
    from nymph.cli.userview import follow, print_instances

    async with UserClient(base_url=url, token=user_token) as c:
        await c.create_provider(
            name="dev", launcher="Kube", kwargs={"namespace": "default"}, dispatch="daemon", replace=True
        )
        await c.create_mode(name="python", provider="dev", fields={"image": cluster.image}, replace=True)
        tags = {"app": "nymph-dev"} | ({"sim.nymph.io/run": "2s"} if cluster.simulated else {})
        accepted = await c.launch(provider="dev", mode="python", script=script, tags=tags)
        iid = str(accepted["instanceId"])
        print(f"      launched {iid}; following its state:", file=sys.stderr, flush=True)
        code = await asyncio.wait_for(follow(c, provider="dev", instance_id=iid, poll_wait=10), 180)
        await _show_output(c, cluster=cluster, instance_id=iid)
        print(file=sys.stderr)
        print_instances([dict(i) for i in await c.list_instances(provider="dev")])
        return iid, code


#: How many earlier runs' state ``nymph dev`` keeps (without --state-dir each run gets its own).
KEEP_RUNS = 5


def fresh_state(base: Path, *, keep: int = KEEP_RUNS) -> Path:
    """A new state directory for one run under ``base/runs`` (so a demo never lists an earlier
    run's instances), removing all but the newest ``keep`` earlier ones; ``base/current`` links
    to it."""
    runs = base / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    earlier = sorted((p for p in runs.iterdir() if p.is_dir()), key=lambda p: p.name)
    for old in earlier[: max(len(earlier) - keep, 0)]:
        shutil.rmtree(old, ignore_errors=True)
    state = runs / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{os.getpid()}"
    state.mkdir()
    # base/current always names the latest run (its user.env is what the README sources)
    link = base / f".current-{os.getpid()}"
    link.unlink(missing_ok=True)
    link.symlink_to(state.relative_to(base))
    link.replace(base / "current")
    return state


def run_dev(opts: DevOptions) -> int:
    """Run the demo; 0 when the launch completed and the audit chain verified."""
    if opts.state_dir:
        state = Path(opts.state_dir).expanduser()
        state.mkdir(parents=True, exist_ok=True)
    else:
        state = fresh_state(platformdirs.user_state_path("nymph") / "dev")
    procs = Procs()
    script = Path(opts.script).read_text() if opts.script else SAMPLE
    signals = Interrupts()
    try:
        step(1, f"state in {state}")
        step(2, "finding a cluster")
        with find_cluster(
            state,
            embedded=opts.embedded,
            node=opts.node,
            node_kind=opts.node_kind,
            checkpoint=signals.check,
            on_stop=signals.stopping,
        ) as cluster:
            try:
                return _run_on(cluster, opts, state=state, script=script, procs=procs, signals=signals)
            finally:
                signals.stopping()
                if any(p.poll() is None for p in procs.items):
                    print("      stopping the daemon and the queue", file=sys.stderr, flush=True)
                procs.stop()  # before the cluster they use
    finally:
        signals.stopping()
        procs.stop()
        signals.restore()


def _run_on(
    cluster: Cluster, opts: DevOptions, *, state: Path, script: str, procs: Procs, signals: Interrupts
) -> int:
    step(3, "starting the queue service", signals)
    db = state / "queue.db"
    user_token, daemon_token = _token(db, "user"), _token(db, "daemon")
    qport = opts.port or free_port()
    url = f"http://127.0.0.1:{qport}"
    qlog = state / "queue.log"
    with signals.held():
        qp = procs.spawn(
            [
                sys.executable,
                "-m",
                "nymph.cli",
                "queue",
                "serve",
                "--db",
                str(db),
                "--listen",
                f"127.0.0.1:{qport}",
                # one user on one machine: the queue may use this machine's own kubeconfig
                "--ambient-kubeconfig",
                # and a kubeconfig the user hands it may reach this cluster (on loopback or
                # this host's own address, refused by default)
                *(a for h in server_hosts(cluster) for a in ("--kube-server-allow", h)),
            ],
            log=qlog,
        )
    _wait_http(f"{url}/healthz", 30, qp, qlog)
    print(f"      queue at {url} (log {qlog})", file=sys.stderr)

    step(4, f"starting the daemon for node {cluster.node}", signals)
    hport = free_port()
    dlog = state / "daemon.log"
    if opts.workdir_root:
        root = Path(opts.workdir_root).resolve()
    elif cluster.embedded:
        root = state / "root"
    else:
        # Pods mount <root>/work/<id> from their node: with kind (make kind-up) the
        # host's /tmp/nymph is mounted into the node at the same path.
        root = Path("/tmp/nymph")
        print(
            f"      workdirs under {root}: the node must see this host path (make kind-up mounts it)",
            file=sys.stderr,
        )
    dargs = [
        sys.executable,
        "-m",
        "nymph.cli",
        "--log-format",
        "json",
        "daemon",
        "--queue",
        url,
        "--node",
        cluster.node,
        "--namespace",
        "default",
        "--workdir-root",
        str(root),
        "--listen",
        f"127.0.0.1:{hport}",
        "--poll-wait",
        "10",
        "--reap-after",
        "300",
    ]
    if cluster.kubeconfig:
        dargs += ["--kubeconfig", cluster.kubeconfig]
    with signals.held():
        dp = procs.spawn(dargs, log=dlog, env={"NYMPH_TOKEN": daemon_token})
    _wait_http(f"http://127.0.0.1:{hport}/healthz", 30, dp, dlog)
    print(f"      daemon health on http://127.0.0.1:{hport}/healthz (log {dlog})", file=sys.stderr)

    step(5, "creating provider 'dev' and mode 'python', submitting a sample launch", signals)
    _iid, code = asyncio.run(_demo(url, user_token, cluster=cluster, script=script))

    step(6, "verifying the audit log", signals)
    result = verify(root / "audit.jsonl")
    print(
        f"      {root / 'audit.jsonl'}: {'ok, ' + str(result.records) + ' records' if result.ok else 'FAILED: ' + result.problem}",
        file=sys.stderr,
    )
    ok = code == 0 and result.ok
    step(
        7,
        "done: the launch reached stopped and the audit chain is intact" if ok else "FAILED (see above)",
        signals,
    )
    if opts.stay:
        (state / "user.env").write_text(f"export NYMPH_URL={url}\nexport NYMPH_TOKEN={user_token}\n")
        os.chmod(state / "user.env", 0o600)
        nymph = nymph_command()
        print(
            f"\nnymph is running. In another shell:\n  source {state / 'user.env'}\n"
            f"  {nymph} launch dev --mode python --script job.py --wait\n  {nymph} instances dev\n"
            "Ctrl-C stops everything.",
            file=sys.stderr,
            flush=True,
        )
        signals.staying()
        while not signals.stop.is_set() and dp.poll() is None and qp.poll() is None:
            signals.stop.wait(1)
        signals.stopping()
        for name, proc, log in (("daemon", dp, dlog), ("queue", qp, qlog)):
            if not signals.stop.is_set() and proc.poll() is not None:
                print(
                    f"the {name} exited with code {proc.returncode}; see {log}. Stopping the rest ...",
                    file=sys.stderr,
                )
                return 1
        print("stopping ...", file=sys.stderr)
    return 0 if ok else 1

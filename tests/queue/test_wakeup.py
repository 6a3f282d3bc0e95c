"""Whether a waiting claim may take a new launch, as its wake-up is routed: never no for a
claim that could take it (a wake kept from it would leave the launch waiting for the claim's
hold to run out), no for a namespace it does not serve or a node that could not run it."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nymph.launch.placement import Needs, NodeOffer, Taint, misfit
from nymph.queue.notify import WorkSignal
from nymph.queue.wakeup import ClaimAccepts, LaunchWork, claim_accepts

GPU = NodeOffer(
    name="g1",
    labels={"pool": "gpu"},
    taints=(Taint(key="gpu", effect="NoSchedule"),),
    allocatable={"cpu": Fraction(8), "nvidia.com/gpu": Fraction(1)},
)
CPU = NodeOffer(name="c1", labels={"pool": "cpu"}, taints=(), allocatable={"cpu": Fraction(8)})
WANTS_GPU = Needs(
    requests={"nvidia.com/gpu": Fraction(1)},
    tolerations=({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},),
)


def test_a_claim_may_take_what_its_namespaces_and_its_node_allow() -> None:
    gpu_job = LaunchWork(kube_namespace="ml", needs=WANTS_GPU)
    assert claim_accepts(namespaces=(), offer=GPU)(gpu_job)
    assert claim_accepts(namespaces=("ml", "web"), offer=GPU)(gpu_job)
    assert not claim_accepts(namespaces=("web",), offer=GPU)(gpu_job)  # another namespace
    assert not claim_accepts(namespaces=(), offer=CPU)(gpu_job)  # no GPU on that node
    assert claim_accepts(namespaces=(), offer=None)(gpu_job)  # no offer: it may take anything
    plain = LaunchWork(kube_namespace="ml", needs=Needs())
    assert not claim_accepts(namespaces=(), offer=GPU)(plain)  # the GPU node's taint
    assert claim_accepts(namespaces=(), offer=CPU)(plain)
    assert not claim_accepts(namespaces=(), offer=GPU)(
        LaunchWork(
            kube_namespace="ml",
            needs=Needs(requests=WANTS_GPU.requests, tolerations=WANTS_GPU.tolerations, avoid=("g1",)),
        )
    )  # moved off that node
    assert claim_accepts(namespaces=("web",), offer=CPU)(object())  # other work: any claim


def test_nodes_offering_the_same_share_a_judgement_and_others_get_their_own() -> None:
    """A judgement is kept by what the node offers (its name left out) and the needs: a node
    of the same pool gets the same answer, a bigger node or other needs their own, whatever
    was judged before them."""
    needs = Needs(requests={"cpu": Fraction(16)})
    small = [NodeOffer(name=f"s{k}", allocatable={"cpu": Fraction(8)}) for k in range(3)]
    big = NodeOffer(name="b", allocatable={"cpu": Fraction(32)})
    work = LaunchWork(kube_namespace="ml", needs=needs)
    assert [claim_accepts(namespaces=(), offer=o)(work) for o in [*small, big]] == [False, False, False, True]
    again = LaunchWork(kube_namespace="ml", needs=Needs(requests={"cpu": Fraction(16)}))
    assert again.number == work.number  # equal needs, one number
    assert claim_accepts(namespaces=(), offer=big)(again) and not claim_accepts(
        namespaces=(), offer=small[0]
    )(again)
    less = LaunchWork(kube_namespace="ml", needs=Needs(requests={"cpu": Fraction(4)}))
    assert less.number != work.number and claim_accepts(namespaces=(), offer=small[1])(less)


_AMOUNT = st.fractions(min_value=0, max_value=16)
_RESOURCES = st.sampled_from(["cpu", "memory", "nvidia.com/gpu"])


@given(
    requests=st.dictionaries(_RESOURCES, _AMOUNT, max_size=3),
    allocatable=st.dictionaries(_RESOURCES, _AMOUNT, max_size=3),
    used=st.dictionaries(_RESOURCES, _AMOUNT, max_size=3),
    labels=st.dictionaries(st.sampled_from(["pool", "zone"]), st.sampled_from(["a", "b"]), max_size=2),
    selector=st.dictionaries(st.sampled_from(["pool", "zone"]), st.sampled_from(["a", "b"]), max_size=2),
)
def test_a_claim_whose_node_could_run_a_launch_is_never_passed_by(
    requests: dict[str, Fraction],
    allocatable: dict[str, Fraction],
    used: dict[str, Fraction],
    labels: dict[str, str],
    selector: dict[str, str],
) -> None:
    """Whatever is placed on the node: if the node can run the launch with it there, the claim
    is one its wake may go to."""
    offer = NodeOffer(name="n", labels=labels, taints=(), allocatable=allocatable)
    needs = Needs(node_selector=tuple(sorted(selector.items())), requests=requests)
    if misfit(needs, offer, used=used) is None:
        assert claim_accepts(namespaces=("ml",), offer=offer)(LaunchWork(kube_namespace="ml", needs=needs))


def test_a_launch_notified_while_no_claim_waits_has_its_needs_never_read() -> None:
    """Reading a launch's needs from its spec (its quantities parsed) is left to the first
    waiting claim asked about it: a POST while no claim waits pays nothing for it, and a claim
    asked reads them once."""
    spec = {"namespace": "ml", "resources": {"requests": {"cpu": "16"}}}
    s = WorkSignal()
    idle = LaunchWork(kube_namespace="ml", spec=spec)
    s.notify(1, item=idle)
    assert "needs" not in vars(idle)
    t = s.ticket(accepts=claim_accepts(namespaces=(), offer=CPU))
    asked = LaunchWork(kube_namespace="ml", spec=spec)
    s.notify(1, item=asked)
    assert not t.event.is_set()  # 16 CPUs: more than the node has
    assert asked.needs.requests == {"cpu": Fraction(16)}


_LABEL = st.text(alphabet="abcxyz./-", min_size=1, max_size=8)
_QUANTITY = st.sampled_from(["1", "500m", "2Gi", "0", "64", "1.5"])


@given(
    selector=st.lists(st.tuples(_LABEL, _LABEL), max_size=3),
    tolerations=st.lists(
        st.fixed_dictionaries(
            {
                "key": _LABEL,
                "operator": st.sampled_from(["Exists", "Equal"]),
                "effect": st.sampled_from(["NoSchedule", "NoExecute"]),
            }
        ),
        max_size=2,
    ),
    requests=st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), _QUANTITY, max_size=3),
    limits=st.dictionaries(st.sampled_from(["cpu", "memory"]), _QUANTITY, max_size=2),
    avoid=st.lists(_LABEL, max_size=2),
    namespace=_LABEL,
)
def test_a_wake_up_relayed_to_another_replica_reads_back_as_the_same_launch(
    selector: list[tuple[str, str]],
    tolerations: list[dict[str, str]],
    requests: dict[str, str],
    limits: dict[str, str],
    avoid: list[str],
    namespace: str,
) -> None:
    """What another replica reads back from a launch's wire form has the same kube namespace
    and needs (so the same claims may take it there), and nothing of the spec but them."""
    spec = {
        "namespace": namespace,
        "script": "print('secret-looking text')",
        "env": {"A": "b"},
        "nodeSelector": [list(p) for p in selector],
        "tolerations": tolerations,
        "resources": {"requests": requests, "limits": limits},
        "avoidNodes": avoid,
    }
    work = LaunchWork(kube_namespace=namespace, spec=spec)
    wire = work.wire()
    assert wire is not None and "secret-looking" not in wire and '"env"' not in wire
    back = LaunchWork.from_wire(wire)
    assert back is not None
    assert back.kube_namespace == namespace and back.needs.key() == work.needs.key()
    for offer in (GPU, CPU):
        assert claim_accepts(namespaces=(namespace,), offer=offer)(back) == claim_accepts(
            namespaces=(namespace,), offer=offer
        )(work)


def test_a_wire_form_it_did_not_write_reads_as_no_work_in_particular() -> None:
    """Text that is not a wake-up's wire form (a newer or broken sender) gives None: the wake
    then wakes any claim, never none; needs too long to send are not sent."""
    nested = "[" * 5000 + "]" * 5000
    for text in ("", "{", "[]", '{"ns": 1, "spec": {}}', '{"ns": "a", "spec": []}', '{"spec": {}}', nested):
        assert LaunchWork.from_wire(text) is None, text
    odd = LaunchWork.from_wire('{"ns": "a", "spec": {"resources": {"requests": {"cpu": "lots"}}}}')
    assert (
        odd is not None and odd.needs.requests == {}
    )  # an unparseable quantity is left out, as the API server's Pod would show
    huge = LaunchWork(kube_namespace="a", spec={"nodeSelector": [["k" * 50, f"v{i}"] for i in range(100)]})
    assert huge.wire() is None
    assert LaunchWork(kube_namespace="a", needs=Needs()).wire() is None  # no spec to send
    assert LaunchWork(kube_namespace="a", spec={"resources": {"requests": {"cpu": object()}}}).wire() is None


class _Member:
    """A waiter's check in a group: the group's items, less the ones this member avoids (as a
    claim whose node a launch avoids)."""

    def __init__(self, group: int, allowed: frozenset[int], avoids: frozenset[int], *, grouped: bool) -> None:
        self.allowed, self.avoids, self.calls = allowed, avoids, 0
        if grouped:
            self.group = group
            self.group_may = lambda item: item in allowed

    def __call__(self, item: int) -> bool:
        self.calls += 1
        return item in self.allowed and item not in self.avoids


_GROUPS = [frozenset({0, 1}), frozenset({2}), frozenset({1, 3}), frozenset()]
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("ticket"), st.integers(0, 4), st.frozensets(st.integers(0, 4), max_size=1)),
        st.tuples(st.just("notify"), st.integers(1, 3), st.one_of(st.none(), st.integers(0, 4))),
        st.tuples(st.just("finish"), st.integers(0, 40), st.booleans()),
        st.tuples(st.just("all"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@given(ops=_OPS)
def test_waiters_counted_by_group_are_woken_exactly_as_when_each_is_asked(
    ops: list[tuple[Any, Any, Any]],
) -> None:
    """A line whose waiters say their group wakes the same waiters, with the same work, as one
    whose waiters are each asked, whatever comes: tickets of any group (or none: group 4 takes
    anything), notifies for any work or none, waiters that finish and hand their wake on, wakes
    of everyone. Its count of waiters by group always matches the line."""
    signals = [WorkSignal(), WorkSignal()]  # grouped, then each asked
    tickets: list[list[Any]] = [[], []]
    for op, a, b in ops:
        for k, s in enumerate(signals):
            if op == "ticket":
                accepts = None if a == 4 else _Member(a, _GROUPS[a], b, grouped=k == 0)
                tickets[k].append(s.ticket(accepts=accepts))
            elif op == "notify":
                s.notify(a, item=b)
            elif op == "finish" and tickets[k]:
                t = tickets[k][a % len(tickets[k])]
                budget = s.finish(t)
                if b and budget is not None:  # it found nothing: the wake goes on
                    s.pass_on(budget, t.wake_for, t.wake_item)
            elif op == "all":
                s.wake_all()
        grouped, asked = signals
        assert [t.event.is_set() for t in tickets[0]] == [t.event.is_set() for t in tickets[1]]
        assert [t.wake_item for t in tickets[0]] == [t.wake_item for t in tickets[1]]
        assert len(grouped) == len(asked)
        assert grouped._alone + sum(n for n, _ in grouped._groups.values()) == len(grouped)


def test_a_wake_for_work_no_group_may_take_asks_no_waiter() -> None:
    """A thousand waiting claims of two pools: a launch neither pool's nodes can run is turned
    away by asking each pool once, not each claim; a waiter that answers alone is still asked."""
    s = WorkSignal()
    offers = [CPU, NodeOffer(name="c2", labels={"pool": "cpu"}, allocatable={"cpu": Fraction(8)})]
    checks = [claim_accepts(namespaces=("ml",), offer=offers[k % 2]) for k in range(1000)]
    for check in checks:
        s.ticket(accepts=check)
    calls = [0]
    real = ClaimAccepts.__call__

    def counted(self: ClaimAccepts, item: object) -> bool:
        calls[0] += 1
        return real(self, item)

    ClaimAccepts.__call__ = counted  # type: ignore[method-assign]
    try:
        s.notify(1, item=LaunchWork(kube_namespace="ml", needs=WANTS_GPU))
        assert calls[0] == 0 and len(s) == 1000
        s.ticket(accepts=lambda item: False)  # answers alone: the line is asked again
        s.notify(1, item=LaunchWork(kube_namespace="ml", needs=WANTS_GPU))
        assert calls[0] == 1000 and len(s) == 1001
        fits = LaunchWork(kube_namespace="ml", needs=Needs(requests={"cpu": Fraction(1)}))
        s.notify(1, item=fits)  # a launch the pool can run: the first in line
        assert calls[0] == 1001 and len(s) == 1000
    finally:
        ClaimAccepts.__call__ = real  # type: ignore[method-assign]

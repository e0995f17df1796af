"""The launcher store's join (dlrm.distributed.rendezvous): every rank waits for all, with a number of
store requests per rank and polling round that does not grow with the world size (a 1,000-rank job's
store would otherwise serve a million requests per round), and the late ranks named once."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
import torch.distributed as dist

from dlrm.distributed import rendezvous
from dlrm.distributed.world import World

ADDRESS = "10.0.0.1:29500"


class CountingStore:
    """An in-memory store with the c10d Store calls the join makes (set, add, check), shared by threads
    that stand for the ranks; counts every request by the thread that made it, a check of the key the
    join polls (`polls`) apart from the others (`requests`)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.changed = threading.Condition()
        self.requests: Counter[str] = Counter()
        self.polls: Counter[str] = Counter()

    def _count(self, poll: bool = False) -> None:
        (self.polls if poll else self.requests)[threading.current_thread().name] += 1

    def set(self, key: str, value: str) -> None:
        self._count()
        with self.changed:
            self.data[key] = value.encode()
            self.changed.notify_all()

    def add(self, key: str, amount: int) -> int:
        self._count()
        with self.changed:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            self.changed.notify_all()
            return value

    def check(self, keys: list[str]) -> bool:
        self._count(poll=keys == [rendezvous.ALL_JOINED])
        with self.changed:
            return all(k in self.data for k in keys)


def join_all(world_size: int, ranks: list[int], timeout_s: float, late: dict[int, float] | None = None) -> tuple:
    """`_join` of each of `ranks` on its own thread (a rank in `late` starts that many seconds after the
    others); (the store, {rank: the exception it raised or None}, the most polls a rank could make)."""
    store, outcome, start = CountingStore(), {}, time.monotonic()

    def rank_main(rank: int) -> None:
        time.sleep((late or {}).get(rank, 0.0))
        try:
            rendezvous._join(store, World(rank, world_size, rank, world_size), ADDRESS, time.monotonic() + timeout_s,
                             timeout_s)  # fmt: skip
            outcome[rank] = None
        except rendezvous.RendezvousTimeout as e:
            outcome[rank] = e

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"rank{r}") for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 30)
    return store, outcome, (time.monotonic() - start) / rendezvous._POLL_S + 2


def test_every_rank_joins_with_a_few_requests_whatever_the_world_size():
    """64 ranks: each makes two requests (its name, the count; the last a third, the key that releases
    the others), then one per polling round: O(W) for the job per round, where polling every rank's
    key from every rank made W per rank per round."""
    world = 64
    store, outcome, rounds = join_all(world, list(range(world)), timeout_s=60)
    assert outcome == {r: None for r in range(world)}
    assert max(store.requests.values()) <= 3 and sum(store.requests.values()) == 2 * world + 1, store.requests
    assert max(store.polls.values()) <= rounds, (store.polls, rounds)


def test_a_late_rank_is_named_by_rank_0_and_counted_by_the_others(monkeypatch, capsys):
    """Past NOTICE_S every waiting rank says so once; rank 0 names the missing rank (a check per rank,
    once), the others count them (one request): still O(W) requests in all."""
    monkeypatch.setattr(rendezvous, "NOTICE_S", 0.3)
    world = 16
    store, outcome, rounds = join_all(world, list(range(world)), timeout_s=60, late={5: 1.5})
    assert outcome == {r: None for r in range(world)}
    notices = [line for line in capsys.readouterr().err.splitlines() if "waiting for" in line]
    assert len(notices) == world - 1, notices
    assert any(n.startswith(f"rank 0 of {world}: waiting for rank(s) 5 to join at {ADDRESS}") for n in notices)
    assert sum("waiting for 1 rank(s) (rank 0 names them)" in n for n in notices) == world - 2
    others = [n for name, n in store.requests.items() if name != "rank0"]
    assert max(others) <= 3 and store.requests["rank0"] <= world + 2, store.requests  # rank 0 checks each name once
    assert max(store.polls.values()) <= rounds, (store.polls, rounds)


def test_ranks_that_never_join_fail_in_one_line_naming_them():
    store, outcome, _ = join_all(3, [0, 1], timeout_s=1.0)
    assert isinstance(outcome[0], rendezvous.RendezvousTimeout) and isinstance(outcome[1], rendezvous.RendezvousTimeout)
    assert str(outcome[0]).startswith(f"rank(s) 2 of WORLD_SIZE=3 never joined at {ADDRESS} within 1 s")
    assert str(outcome[1]).startswith("1 rank(s) (rank 0 names them) of WORLD_SIZE=3 never joined")
    assert "\n" not in str(outcome[0]) and "trainer.collective_timeout_s" in str(outcome[0])


@pytest.mark.parametrize("store", [dist.HashStore(), dist.PrefixStore("dlrm/job", dist.HashStore())])
def test_the_join_runs_on_torch_stores(store):
    """The calls as torch's own stores have them (the fake above mirrors them)."""
    rendezvous._join(store, World(0, 1, 0, 1), ADDRESS, time.monotonic() + 5, 5)
    assert store.check([rendezvous.ALL_JOINED]) and store.add(rendezvous.JOINED, 0) == 1


def test_a_group_made_again_in_one_process_reads_none_of_the_earlier_groups_keys(monkeypatch):
    """Runs in one process (a test launch's jobs) each make their group through the launcher store: the
    second store must not show the first group's keys (Gloo's addresses: a rank that read its peer's old,
    closed address failed to connect, at random, with "Connection refused")."""
    shared = dist.HashStore()  # the agent's store, one per launch
    monkeypatch.setattr(rendezvous, "_connect", lambda *args: shared)
    monkeypatch.setattr(rendezvous, "_join", lambda *args: None)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    world = World(rank=0, world_size=2, local_rank=0, local_world_size=2)
    first = rendezvous.launcher_store(world, 5)
    first.set("default_pg/0//gloo/0", "127.0.0.1:6060")
    second = rendezvous.launcher_store(world, 5)
    assert not second.check(["default_pg/0//gloo/0"])

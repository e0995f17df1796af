"""On 2 Gloo ranks with rank 1 made slow on purpose (a sleep before each of its steps): the breakdown
puts the wait on rank 0, before its collectives, and names rank 1 as the slowest."""

import time

import pytest

from dlrm.comms.measured import CommVsModel, checked_bench
from dlrm.config import validate, validate_world
from dlrm.distributed.world import World
from tests.helpers.families import PAIR, Overrides, runs

SLEEP_S = 1.0  # far above a tiny step (and the noise of a loaded 2-core machine), so the wait is unmistakable


def slow_rank_summary(cfg, slow_rank: int, sleep_s: float) -> dict:
    """Train with `slow_rank` sleeping `sleep_s` before each step (inside the profiled step, before
    its first collective); the summary, with comm_vs_model as `dlrm.train` adds it."""
    from dlrm.trainer.build import build
    from dlrm.trainer.loop import train

    validate(cfg)
    world = World.from_env()
    validate_world(cfg, world.world_size, world.local_world_size)
    bench = checked_bench(cfg, world.local_world_size)
    trainer = build(cfg, world)
    trainer.summary_parts.append(CommVsModel(cfg, world, trainer.plan, trainer.dense_params, bench))
    if trainer.world.rank == slow_rank:
        step_once = trainer.step_once

        def slow(batches):
            time.sleep(sleep_s)
            return step_once(batches)

        trainer.step_once = slow  # the profiler's step calls trainer.step_once
    return train(trainer)


RUN = Overrides(
    "model=tiny",
    "sharding=table_wise",  # an embedding exchange whatever the cpu topology's fitted figures plan
    "data.global_batch_size=32",
    "data.eval_batches=1",
    "trainer.max_steps=6",
    "trainer.log_every_steps=2",
    "trainer.breakdown=true",
    "trainer.breakdown_every=1",
    "trainer.progress=none",
    "trainer.tensorboard=false",
    "checkpoint.at_end=false",
)


@pytest.mark.slow
@runs(summaries=PAIR.job(slow_rank_summary, RUN, 1, SLEEP_S))
def test_the_wait_lands_on_the_fast_rank_and_names_the_slow_one(summaries):
    summary, _ = summaries
    b = summary["step_breakdown"]
    assert b["slowest_rank"] == 1, b
    late = b["waited_for_rank_s"]
    assert late[1] >= 0.8 * SLEEP_S, b  # rank 0 cannot start its first collective's transfer before rank 1 enters
    assert late[0] < 0.5 * late[1], b
    # mean over the 2 ranks: rank 0 waited about the sleep, rank 1 about nothing
    assert b["comm_wait_s"]["alltoall"] + b["comm_wait_s"].get("allreduce", 0.0) >= 0.4 * SLEEP_S
    for kind, total in b["comm_s"].items():
        assert 0.0 <= b["comm_wait_s"][kind] + b["comm_behind_s"][kind] <= total + 1e-9
        transfer = total - b["comm_wait_s"][kind] - b["comm_behind_s"][kind]
        assert b["comm_transfer_s"][kind] == pytest.approx(transfer, abs=1e-9)
    versus = summary["comm_vs_model"]
    assert versus["slowest_rank"] == 1
    row = versus["embedding_exchange"]
    transfer = row["total_s"] - row["wait_s"] - row["behind_s"]
    assert row["compared"] and row["transfer_s"] == pytest.approx(transfer, abs=1e-9)
    # the collectives' own time (last entry to last exit): what is compared; never more than the two
    # ranks' time in them together
    own = sum(b["comm_critical_s"][k] for k in ("alltoall", "reduce_scatter", "allgather"))
    assert row["measured_s"] == pytest.approx(own, abs=1e-9)
    assert 0.0 < own <= 2 * row["total_s"] + 1e-9
    assert row["ratio"] == pytest.approx(row["measured_s"] / row["model_s"])

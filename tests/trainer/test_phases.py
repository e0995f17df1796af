"""dlrm.trainer.phases: waiting for peers told apart from transfer, from every rank's entry times."""

import pytest

from dlrm.trainer.phases import STEP_RANGE, Span, collective_spans, split_waits


def test_the_early_rank_waits_for_the_late_one_and_names_it():
    # rank 0 enters both collectives early; rank 1 enters the alltoall 30 ms and the allreduce 5 ms later
    own0 = {"alltoall": [(1.000, 1.040)], "allreduce": [(1.100, 1.110)]}
    own1 = {"alltoall": [(1.030, 1.040)], "allreduce": [(1.105, 1.110)]}
    entries = [{k: [a for a, _ in v] for k, v in own.items()} for own in (own0, own1)]
    w0, w1 = split_waits(own0, entries, 0), split_waits(own1, entries, 1)
    assert w0.wait_s == pytest.approx({"alltoall": 0.030, "allreduce": 0.005})
    assert w1.wait_s == pytest.approx({"alltoall": 0.0, "allreduce": 0.0})
    assert w0.late_s == pytest.approx([0.0, 0.035]) and w1.late_s == w0.late_s  # every rank sees the same
    assert not w0.unmatched


def test_a_wait_never_exceeds_the_collective_and_overlaps_count_once():
    own = {"alltoall": [(0.0, 0.010), (0.005, 0.020)]}  # two alltoalls in flight at once
    entries = [{"alltoall": [0.0, 0.005]}, {"alltoall": [0.050, 0.008]}]
    w = split_waits(own, entries, 0)
    assert w.wait_s["alltoall"] == pytest.approx(0.010)  # [0, 10 ms] within the first, [5, 8] inside it


def test_a_collective_entered_while_another_kind_runs_is_behind_it_for_the_overlap():
    # DDP's allreduce enters at 30 ms while the gradient alltoall (entered at 0) runs to 40 ms: its first
    # 10 ms are the alltoall's on the link; the peer entered the allreduce at 32 ms, which stays waiting
    own = {"alltoall": [(0.000, 0.040)], "allreduce": [(0.030, 0.050)]}
    entries = [{"alltoall": [0.000], "allreduce": [0.030]}, {"alltoall": [0.000], "allreduce": [0.032]}]
    w = split_waits(own, entries, 0)
    assert w.wait_s == pytest.approx({"alltoall": 0.0, "allreduce": 0.002})
    assert w.behind_s == pytest.approx({"alltoall": 0.0, "allreduce": 0.008})  # [32, 40] ms: counted once
    assert w.wait_s["allreduce"] + w.behind_s["allreduce"] <= 0.020  # never more than the collective


def test_a_collective_lasts_from_the_last_entry_to_the_last_exit_once_the_link_is_its():
    # rank 0 leaves the alltoall at 10 ms (it has its data) while rank 1, in from 2 ms, gets its bytes
    # until 30 ms: the alltoall's own time is [2, 30] ms, though rank 0's transfer is 8 ms. Both enter
    # the allreduce by 25 ms and leave it at 40: served once the alltoall ends, [30, 40]
    own0 = {"alltoall": [(0.000, 0.010)], "allreduce": [(0.020, 0.040)]}
    own1 = {"alltoall": [(0.002, 0.030)], "allreduce": [(0.025, 0.038)]}
    entries = [{k: [a for a, _ in v] for k, v in own.items()} for own in (own0, own1)]
    exits = [{k: [b for _, b in v] for k, v in own.items()} for own in (own0, own1)]
    w0, w1 = split_waits(own0, entries, 0, exits), split_waits(own1, entries, 1, exits)
    assert w0.critical_s == pytest.approx({"alltoall": 0.028, "allreduce": 0.010})
    assert w1.critical_s == w0.critical_s  # one figure per collective, whichever rank computes it
    assert w0.wait_s["alltoall"] == pytest.approx(0.002)  # rank 0: 2 ms waiting, then 8 ms its own transfer
    assert split_waits(own0, entries, 0).critical_s == {}  # no exit times: not measured


def test_collectives_in_flight_together_count_as_the_link_serves_them_whatever_the_entry_order():
    # a 30 ms alltoall from 0; DDP's allreduce entered at 10 ms; a second alltoall entered at 20 ms but
    # served first (it ends at 45 ms), then the allreduce (ends at 55): 30 + 15 ms alltoall, 10 allreduce
    own = {"alltoall": [(0.000, 0.030), (0.020, 0.045)], "allreduce": [(0.010, 0.055)]}
    times = [{k: [a for a, _ in v] for k, v in own.items()}] * 2
    exits = [{k: [b for _, b in v] for k, v in own.items()}] * 2
    assert split_waits(own, times, 0, exits).critical_s == pytest.approx({"alltoall": 0.045, "allreduce": 0.010})


def test_collectives_that_differ_across_ranks_are_not_split():
    own = {"alltoall": [(0.0, 0.01)], "allreduce": [(0.02, 0.03)]}
    entries = [{"alltoall": [0.0], "allreduce": [0.02]}, {"alltoall": [0.0, 0.015], "allreduce": [0.021]}]
    w = split_waits(own, entries, 0)
    assert w.unmatched == ["alltoall"] and set(w.wait_s) == {"allreduce"}


def test_collective_spans_are_those_of_the_step_in_order():
    spans = [
        Span(STEP_RANGE, 1, 1.0, 2.0),
        Span("gloo:all_to_all", 7, 1.5, 1.6),
        Span("gloo:all_to_all", 8, 1.2, 1.3),
        Span("gloo:all_reduce", 7, 1.7, 2.1),
        Span("gloo:all_reduce", 7, 2.5, 2.6),  # after the step
        Span("## forward ##", 1, 1.1, 1.2),
    ]
    assert collective_spans(spans) == {"alltoall": [(1.2, 1.3), (1.5, 1.6)], "allreduce": [(1.7, 2.1)]}

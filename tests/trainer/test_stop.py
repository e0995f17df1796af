"""The stop handler only records: the first SIGINT/SIGTERM/SIGHUP sets the flag the loop reads at its
log step, a second one ends the process at once (one line on rank 0, exit 128 + signal) and nothing
is ever raised from the handler; TrainingStopped survives a pickle round trip (a collective gathers it)."""

from __future__ import annotations

import os
import pickle
import signal
from types import SimpleNamespace

import pytest

from dlrm.trainer import stop as stop_module
from dlrm.trainer.stop import SIGNALS, StopRequest, TrainingStopped, stopped_meanwhile


@pytest.fixture(autouse=True)
def _handlers():
    """A signalled StopRequest keeps its handlers (its process is ending): restore them after each test."""
    before = {s: signal.getsignal(s) for s in SIGNALS}
    yield
    for s, handler in before.items():
        signal.signal(s, handler)
    stop_module._installed = None


class _Exited(BaseException):
    """Stands in for os._exit in the handler under test."""


def _request(is_main: bool = True) -> tuple[StopRequest, list[int]]:
    codes: list[int] = []

    def exit(code: int) -> None:
        codes.append(code)
        raise _Exited

    return StopRequest(is_main, exit=exit), codes


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_only_sets_the_flag(signum):
    stop, codes = _request()
    stop.install(SimpleNamespace(step=7))
    try:
        os.kill(os.getpid(), signum)  # the handler runs here, in the main thread; it must not raise
        assert stop.signum == signum and stop.flag == 1.0 and codes == []
    finally:
        stop.uninstall()


def test_a_second_signal_exits_at_once_with_one_line_on_rank_0(capfd):
    stop, codes = _request()
    stop.install(SimpleNamespace(step=7))
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        with pytest.raises(_Exited):
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        stop.uninstall()
    assert codes == [128 + signal.SIGTERM]
    err = capfd.readouterr().err
    assert err == (
        "stopped: by a second SIGTERM during step 8, without a checkpoint; continue from the last one "
        "with the same command and trainer.resume=auto\n"
    )
    stop._handle(signal.SIGTERM, None)  # a third: nothing more (the process is already ending)
    assert codes == [128 + signal.SIGTERM]


def test_a_second_signal_elsewhere_exits_without_a_line(capfd):
    stop, codes = _request(is_main=False)
    stop._handle(signal.SIGINT, None)
    with pytest.raises(_Exited):
        stop._handle(signal.SIGINT, None)
    assert codes == [128 + signal.SIGINT] and capfd.readouterr().err == ""


def test_signals_during_the_stop_change_nothing():
    stop, codes = _request()
    stop._handle(signal.SIGTERM, None)
    stop.stopping = True  # the trainer is saving its stop checkpoint
    stop._handle(signal.SIGTERM, None)
    stop._handle(signal.SIGHUP, None)
    assert codes == [] and stop.signum == signal.SIGTERM


def test_training_stopped_survives_a_pickle_round_trip():
    e = pickle.loads(pickle.dumps(TrainingStopped("by SIGHUP at step 5 of 9", signal.SIGHUP)))
    assert isinstance(e, TrainingStopped) and str(e) == "by SIGHUP at step 5 of 9"
    assert e.signum == signal.SIGHUP and e.exit_code == 128 + signal.SIGHUP


def test_a_lost_peer_after_a_signal_is_reported_as_the_stop():
    stop, codes = _request()
    stop.install(SimpleNamespace(step=3))
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        e = stopped_meanwhile()
        assert e is not None and e.exit_code == 128 + signal.SIGTERM and "during step 4" in str(e)
        stop._handle(signal.SIGTERM, None)  # the line is being reported: a late signal adds nothing
        assert codes == []
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) == stop._handle  # signalled: kept for a further signal
    stop.signum = None
    stop.uninstall()
    assert stopped_meanwhile() is None and signal.getsignal(signal.SIGTERM) != stop._handle

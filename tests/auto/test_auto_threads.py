"""Issue 27, twelfth stop: auto's measurements on a busy machine with more than one thread.

With one torch thread the CPU adapter times a run by the calling thread's CPU time, which
other processes' time slices do not reach.  With two or more (torch's default) the run's
work spreads over threads, and a run was timed once on the wall clock: at load 5 on 2 cores
about 60% of the runs of a 1.3 ms call waited 3-60 ms for a core, the spike rule kept them
(more than a third of a side's runs) and the figures were the load's.  Now the adapter may
count the time its threads waited (``ampcore_auto_waited``; the CPU adapter: the threads'
run delay from ``/proc/self/task/*/schedstat``), and a run while which they waited is
timed again.  Fake clocks and fake ``/proc`` trees only: no wall-clock threshold anywhere.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from conftest import make_adapter

import ampcore
from ampcore._auto._hostclock import TRIES, HostClock, lost, preempted
from ampcore._auto._measure import MAX_RUNS, MIN_RUNS, device_clock, measure

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


class Machine:
    """A fake host: ``now()`` in seconds, ``waited()`` the threads' summed wait; ``work(ms,
    wait_ms)`` a run that takes ``ms`` of its own plus ``wait_ms`` pre-empted (the wall
    clock sees both, the wait count the second)."""

    def __init__(self) -> None:
        self.t = 0.0
        self.w = 0.0
        self.reads = 0

    def now(self) -> float:
        return self.t

    def waited(self) -> float:
        self.reads += 1
        return self.w

    def work(self, ms: float, wait_ms: float = 0.0) -> None:
        self.t += (ms + wait_ms) / 1e3
        self.w += wait_ms / 1e3


def _clock(machine: Machine, counts: bool = True) -> HostClock:
    return HostClock(lambda: None, lambda: machine.now, lambda: machine.waited if counts else None)


# -- the host clock: pre-empted tries are timed again -----------------------------------------


def test_a_run_pre_empted_by_other_work_is_timed_again() -> None:
    machine = Machine()
    clock = _clock(machine)
    waits = iter([30.0, 0.0])  # the first try waited 30 ms for a core
    assert clock(lambda: machine.work(2.0, next(waits)), "fp32") == pytest.approx(2.0)
    assert clock.lost_ms == pytest.approx(32.0) and lost(clock) == pytest.approx(32.0)


def test_waits_within_the_share_are_no_pre_emption() -> None:
    machine = Machine()
    clock = _clock(machine)
    runs: list[int] = []

    def run() -> None:
        runs.append(1)
        machine.work(10.0, 0.04)  # a worker's wake-up: 40 us of 10 ms

    assert clock(run, "low") == pytest.approx(10.04) and runs == [1] and clock.lost_ms == 0.0
    assert not preempted(0.0004, 0.010) and preempted(0.0006, 0.010)  # 5% of the run
    assert not preempted(0.00004, 0.0001) and preempted(0.00006, 0.0001)  # at least 50 us


def test_every_try_pre_empted_the_fastest_counts() -> None:
    machine = Machine()
    clock = _clock(machine)
    waits = iter([9.0, 3.0, 20.0, 5.0])
    took = clock(lambda: machine.work(2.0, next(waits)), "fp32")
    assert took == pytest.approx(5.0)  # 2 + the least wait: other work only ever adds time
    assert clock.lost_ms == pytest.approx((11 + 5 + 22 + 7) - 5.0) and TRIES == 4


def test_without_a_count_each_run_is_timed_once_as_before() -> None:
    machine = Machine()
    clock = _clock(machine, counts=False)
    assert clock(lambda: machine.work(2.0, 30.0), "fp32") == pytest.approx(32.0)
    assert machine.reads == 0 and clock.lost_ms == 0.0


def test_the_count_is_read_outside_the_timed_interval() -> None:
    machine = Machine()
    order: list[str] = []

    def now() -> float:
        order.append("clock")
        return machine.now()

    def waited() -> float:
        order.append("count")
        return machine.waited()

    synced: list[str] = []
    clock = HostClock(lambda: synced.append("sync") or order.append("sync"), lambda: now, lambda: waited)
    clock(lambda: order.append("run"), "fp32")
    assert order == ["sync", "count", "clock", "run", "sync", "clock", "count"]
    assert synced == ["sync", "sync"]  # no synchronisation added to a clean run


# -- a class measured at two threads on a busy machine ------------------------------------------


class Busy:
    """A busy 2-core machine at load 5 with two threads: a run of each label takes its
    ``ms``; three tries of float32 and low in five wait 8-40 ms for a core (a fixed pattern)."""

    def __init__(self, machine: Machine, ms: dict[str, float]) -> None:
        self.machine, self.ms, self.clock = machine, ms, _clock(machine)
        self._waits = itertools.cycle([0.0, 25.0, 8.0, 0.0, 40.0, 12.0, 0.0, 30.0, 9.0, 0.0])
        self._jitter = itertools.cycle([1.0, 1.01, 0.99])

    @property
    def lost_ms(self) -> float:
        return self.clock.lost_ms

    def __call__(self, run: Callable[[], None], label: Any) -> float:
        def one_try() -> None:
            run()
            wait = next(self._waits) if label in ("fp32", "low") else 0.0
            self.machine.work(self.ms[label] * next(self._jitter), wait)

        return self.clock(one_try, label)


def _measured(timed: Any, budget_ms: float = 400.0) -> Any:
    return measure(torch.nn.Linear(8, 8), (torch.randn(4, 8),), {}, "cpu", torch.bfloat16, timed, budget_ms)


def test_a_busy_two_thread_class_is_measured_at_its_quiet_figures() -> None:
    # low 20% faster than float32; three tries in five wait for a core
    costs = _measured(Busy(Machine(), {"fp32": 3.0, "low": 2.4, "casts": 0.1}))
    assert costs.fp32_ms == pytest.approx(3.0, rel=0.02) and costs.low_ms == pytest.approx(2.4, rel=0.02)
    assert costs.fp32_spread < 0.05 and costs.low_spread < 0.05 and not costs.estimated
    # timed once each (no count: the wall clock as before), the spike rule kept the waits
    # (more than a third of each side's runs) and the figures were the load's
    walled = Busy(Machine(), {"fp32": 3.0, "low": 2.4, "casts": 0.1})
    walled.clock = _clock(walled.machine, counts=False)
    before = _measured(walled)
    assert before.fp32_spread > 0.5 and before.low_spread > 0.5
    assert before.low_ms > before.fp32_ms > 2 * 3.0  # the wrong way: low looked the slower side


def test_the_tries_timed_again_count_against_the_share() -> None:
    machine = Machine()
    timed = Busy(machine, {"fp32": 3.0, "low": 2.4, "casts": 0.1})
    costs = _measured(timed, budget_ms=60.0)
    assert timed.lost_ms > 0.0
    assert MIN_RUNS <= costs.runs < MAX_RUNS  # the share ran out, but not before a figure's rounds
    worst_round = 2 * TRIES * (3.03 + 40.0)
    assert machine.t * 1e3 < 60.0 + worst_round + 1.0  # the share, one round over at most, the casts


# -- the adapter's hook -----------------------------------------------------------------------


def test_the_host_clock_uses_the_adapters_count_of_waits(register: Callable[..., Any]) -> None:
    machine = Machine()
    asked: list[int] = []

    def waited(device_index: int) -> Callable[[], float]:
        asked.append(device_index)
        return machine.waited

    backend = register(
        make_adapter(
            "waits",
            ampcore_synchronize=lambda device_index: None,
            ampcore_auto_timer=lambda device_index: machine.now,
            ampcore_auto_waited=waited,
        )
    )
    clock = device_clock(backend, 2)
    assert clock is not None
    waits = iter([15.0, 0.0])
    assert clock(lambda: machine.work(1.0, next(waits)), "fp32") == pytest.approx(1.0)
    assert asked == [2] and lost(clock) == pytest.approx(16.0)


@pytest.mark.parametrize("bad", [3.0, "schedstat"])
def test_a_count_that_is_no_function_is_a_plugin_error(register: Callable[..., Any], bad: object) -> None:
    backend = register(
        make_adapter(
            "badwaits", ampcore_synchronize=lambda device_index: None, ampcore_auto_waited=lambda device_index: bad
        )
    )
    clock = device_clock(backend, 0)
    assert clock is not None
    with pytest.raises(ampcore.PluginError, match="ampcore_auto_waited.*expected None or a function"):
        clock(lambda: None, "fp32")


@pytest.mark.parametrize("reading", [-1.0, float("nan"), float("inf"), "12", None, True])
def test_a_count_that_reads_no_seconds_is_a_plugin_error(register: Callable[..., Any], reading: object) -> None:
    backend = register(
        make_adapter(
            "badcount",
            ampcore_synchronize=lambda device_index: None,
            ampcore_auto_waited=lambda device_index: lambda: reading,
        )
    )
    clock = device_clock(backend, 0)
    assert clock is not None
    ran: list[int] = []
    with pytest.raises(ampcore.PluginError, match="ampcore_auto_waited.*expected the seconds waited"):
        clock(lambda: ran.append(1), "fp32")
    assert ran == []  # read before the run: nothing timed with a broken count


def test_a_count_that_raises_is_a_plugin_error(register: Callable[..., Any]) -> None:
    def broken() -> float:
        raise OSError("no schedstat")

    backend = register(
        make_adapter(
            "raisingcount",
            ampcore_synchronize=lambda device_index: None,
            ampcore_auto_waited=lambda device_index: broken,
        )
    )
    clock = device_clock(backend, 0)
    assert clock is not None
    with pytest.raises(ampcore.PluginError, match="ampcore_auto_waited.*raised OSError: no schedstat"):
        clock(lambda: None, "fp32")


# -- the CPU adapter: run delay with more than one thread ---------------------------------------


def test_the_cpu_adapter_counts_run_delay_with_more_than_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    from ampcore_backends import _schedstat, cpu

    reader = _schedstat.RunDelay()
    monkeypatch.setattr(cpu, "run_delay_reader", lambda: reader)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert cpu.ampcore_auto_waited() is reader and cpu.ampcore_auto_timer() is None  # the wall clock, waits counted
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert cpu.ampcore_auto_waited() is None  # the thread's CPU time leaves waits out already
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    monkeypatch.setattr(cpu, "run_delay_reader", lambda: None)  # no schedstat: as before
    assert cpu.ampcore_auto_waited() is None and cpu.ampcore_auto_timer() is None


def _task(tasks: Path, tid: int, delay_ns: int) -> None:
    (tasks / str(tid)).mkdir(exist_ok=True)
    (tasks / str(tid) / "schedstat").write_text(f"123456 {delay_ns} 7\n")


def test_run_delay_sums_the_threads_of_the_process(tmp_path: Path) -> None:
    from ampcore_backends._schedstat import RunDelay

    _task(tmp_path, 10, 1_000_000)
    _task(tmp_path, 11, 2_500_000)
    reader = RunDelay(str(tmp_path))
    assert reader() == pytest.approx(0.0035)
    _task(tmp_path, 11, 4_500_000)  # the worker waited 2 ms more
    _task(tmp_path, 12, 500_000)  # a new worker
    assert reader() == pytest.approx(0.006)
    (tmp_path / "10" / "schedstat").unlink()
    (tmp_path / "10").rmdir()  # a thread that ended: its file closed, its share gone
    assert reader() == pytest.approx(0.005) and set(reader._files) == {"11", "12"}


def test_run_delay_tolerates_a_thread_ending_while_read(tmp_path: Path) -> None:
    from ampcore_backends._schedstat import RunDelay

    _task(tmp_path, 20, 3_000_000)
    (tmp_path / "21").mkdir()  # listed, but its file is gone (the thread ended meanwhile)
    assert RunDelay(str(tmp_path))() == pytest.approx(0.003)


@pytest.mark.parametrize("content", [None, "", "1 2 x\n"])
def test_without_readable_schedstat_there_is_no_count(tmp_path: Path, content: str | None) -> None:
    from ampcore_backends._schedstat import run_delay_reader

    me = tmp_path / str(__import__("threading").get_native_id())
    if content is not None:
        me.mkdir()
        (me / "schedstat").write_text(content)
    assert run_delay_reader(str(tmp_path)) is None  # no CONFIG_SCHED_INFO, not Linux, hidden: as before
    _task(tmp_path, int(me.name), 0)
    assert run_delay_reader(str(tmp_path)) is not None


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux /proc")
def test_the_real_run_delay_reader_reads_this_process() -> None:
    from ampcore_backends._schedstat import run_delay_reader

    reader = run_delay_reader()
    if reader is None:
        pytest.skip("this kernel gives no run delay")
    first = reader()
    assert isinstance(first, float) and first >= 0.0 and reader() >= 0.0

"""DeviceMonitor: the device's own utilization, sampled in the background; honest where there is none."""

from __future__ import annotations

import itertools
import time

import pytest

import flyteplugins_batcher as ours


def test_without_an_nvidia_gpu_it_says_so():
    monitor = ours.DeviceMonitor(interval_s=0.01)
    if monitor.available:
        pytest.skip("an NVIDIA GPU is visible here")
    monitor.start()
    monitor.stop()
    utilization = monitor.utilization()
    assert not utilization.available and utilization.samples == 0
    assert utilization.note.startswith("not available")


def test_samples_are_averaged_in_the_background():
    readings = itertools.cycle([0.2, 0.6])
    monitor = ours.DeviceMonitor(interval_s=0.005, sampler=lambda: next(readings))
    monitor.start()
    deadline = time.monotonic() + 2
    while monitor.utilization().samples < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    monitor.stop()
    utilization = monitor.utilization()
    assert utilization.available and utilization.samples >= 10
    assert 0.2 <= utilization.mean <= 0.6
    assert abs(utilization.mean - 0.4) <= 0.2 / utilization.samples + 1e-9


def test_a_failing_sampler_stops_quietly_and_keeps_what_it_had():
    calls = iter([0.5, RuntimeError("driver gone")])

    def flaky() -> float:
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value

    monitor = ours.DeviceMonitor(interval_s=1, sampler=flaky)
    monitor.sample()
    monitor.sample()
    utilization = monitor.utilization()
    assert utilization.samples == 1 and utilization.mean == 0.5
    assert "driver gone" in utilization.note

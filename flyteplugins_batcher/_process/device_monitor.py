"""DeviceMonitor: what the GPU itself says about how busy it was, sampled through NVML.

The batcher's `stats.utilization` is the fraction of time a batch was inside the process
function. The device can tell more: NVML's utilization is the fraction of time a kernel was
running on the GPU, so a process function that holds the GPU but leaves it idle (waiting on the
host, say) shows up. This samples it in a background thread while work runs. Where there is no
NVIDIA GPU (or no `nvidia-ml-py`), it says so instead of guessing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger("flyteplugins_batcher")

Sampler = Callable[[], float]
"""Returns the device's utilization now, in 0..1."""


@dataclass(frozen=True)
class DeviceUtilization:
    """What the device reported.

    Attributes:
        available: Whether the device could be asked (an NVIDIA GPU through NVML).
        mean: Mean utilization over the samples, 0..1 (0 when none).
        samples: How many samples were taken.
        note: Which device, or why none could be asked.
    """

    available: bool
    mean: float = 0.0
    samples: int = 0
    note: str = ""


class DeviceMonitor:
    """Samples the GPU's own utilization in a background thread.

    Args:
        interval_s: Seconds between samples.
        device_index: Which GPU (NVML index).
        sampler: Where samples come from; by default NVML for `device_index`. Tests and other
            devices pass their own.

    Example:
        ```python
        monitor = DeviceMonitor()
        monitor.start()
        ...  # run the batches
        print(monitor.utilization())  # DeviceUtilization(available=True, mean=0.93, ...)
        monitor.stop()
        ```
    """

    def __init__(self, interval_s: float = 0.5, device_index: int = 0, sampler: Sampler | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self._note = "custom sampler"
        self._sampler = sampler
        if sampler is None:
            self._sampler, self._note = _nvml_sampler(device_index)
        self._lock = threading.Lock()
        self._total = 0.0
        self._count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        """Whether the device can be sampled."""
        return self._sampler is not None

    def start(self) -> None:
        """Start sampling (idempotent); does nothing where no device can be asked."""
        if self._sampler is None or (self._thread is not None and self._thread.is_alive()):
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True, name="device-monitor")
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling; what was sampled stays readable."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval_s)
            self._thread = None

    def sample(self) -> None:
        """Take one sample now (the thread calls this every `interval_s`)."""
        if self._sampler is None:
            return
        try:
            value = self._sampler()
        except Exception as error:  # a sampling failure must never hurt the work being measured
            logger.warning("device monitor: sampling failed, stopping: %s", error)
            self._sampler = None
            self._note = f"sampling failed: {error}"
            return
        with self._lock:
            self._total += value
            self._count += 1

    def utilization(self) -> DeviceUtilization:
        """Mean utilization over the samples so far."""
        with self._lock:
            count, total = self._count, self._total
        if self._sampler is None and not count:
            return DeviceUtilization(available=False, note=self._note)
        return DeviceUtilization(available=True, mean=total / count if count else 0.0, samples=count, note=self._note)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()


def _nvml_sampler(device_index: int) -> tuple[Sampler | None, str]:
    """An NVML utilization sampler for one GPU, or `None` and the reason there is none."""
    try:
        import pynvml
    except ImportError:
        return None, "not available: nvidia-ml-py is not installed (it comes with the GPU image)"
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        name = pynvml.nvmlDeviceGetName(handle)
    except Exception as error:  # NVMLError has many subclasses: no driver, no device, ...
        return None, f"not available: no NVIDIA GPU ({error})"
    name = name.decode() if isinstance(name, bytes) else name

    def sample() -> float:
        return pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0

    return sample, f"NVML, GPU {device_index} ({name})"

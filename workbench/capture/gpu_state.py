"""What the GPU's clocks, power and temperature did while a bench's rows were timed.

Two runs of one bench on the H200 can differ by 5-10% in every row of a size at once (bench
moe at T=33,863: flat on bf16 experts 13.29 ms in one run, 14.13 in the next, every peer
slower by as much): the GPU's state, not the kernels. Rows timed in turns share that state,
so their ratios hold; a time, or a share of a ceiling measured minutes before, does not. So
while each group of rows is timed in turns (`bench_rows.check_then_time`) a thread reads NVML
(nvidia-ml-py) every `INTERVAL_S`: SM and memory clocks, power draw, temperature, and the
reasons NVML gives for holding the clocks below their maximum. The bench keeps them as its
`gpu_state` table, so a reader can tell a slow kernel from a slow GPU
(`analysis.gpu_state` summarises them).

Reading NVML does not change the GPU's settings. Where it cannot be read (a CPU run, no
nvidia-ml-py, no NVML driver), the log says why and stays empty: the bench still runs.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import TracebackType

import torch

INTERVAL_S = 0.1  # a sample every 0.1 s: several in the shortest group's rounds (~1 s)
# NVML's clocks-event reason bits that mean the clocks were held down (nvmlClocksEventReason*);
# idle, application clocks, sync boost and display settings are left out: none slows a kernel.
SLOWDOWNS = {
    0x4: "power-cap",
    0x8: "hw-slowdown",
    0x20: "thermal",
    0x40: "hw-thermal",
    0x80: "power-brake",
}
COLUMNS = ("t_s", "sm_mhz", "mem_mhz", "power_w", "temp_c", "slowdown")


def slowdown_names(bits: int) -> str:
    """The slowdown reasons set in NVML's reason `bits`, joined by '+'; '' for none."""
    return "+".join(name for bit, name in SLOWDOWNS.items() if bits & bit)


@dataclass
class GpuStateLog:
    """The samples taken while a group of rows was timed (dicts of COLUMNS, `t_s` from the
    start), or, in `unavailable`, why none could be taken. Used as a context manager: sampling
    runs from enter to exit in a daemon thread."""

    device: torch.device
    interval_s: float = INTERVAL_S
    samples: list[dict] = field(default_factory=list)
    unavailable: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def __enter__(self) -> GpuStateLog:
        try:
            reader = open_reader(self.device)
        except Unavailable as why:
            self.unavailable = str(why)
            return self
        self._thread = threading.Thread(target=self._sample, args=(reader,), daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    def _sample(self, reader: NvmlReader) -> None:
        """One sample now and every interval until stopped, then one more at the stop. A read
        that fails ends the log with its reason; the timing it watches goes on."""
        start = time.perf_counter()
        while True:
            try:
                since = round(time.perf_counter() - start, 3)  # ms: the reads are 0.1 s apart
                self.samples.append({"t_s": since} | reader.read())
            except Exception as err:  # noqa: BLE001 (NVML's errors are many; any ends the log)
                self.unavailable = f"NVML stopped answering: {type(err).__name__}: {err}"
                return
            if self._stop.is_set():
                return
            self._stop.wait(self.interval_s)


class Unavailable(Exception):
    """NVML cannot be read for this device; the message says why."""


class NvmlReader:
    """NVML's handle of a torch CUDA device, found by its PCI bus id (NVML numbers GPUs its own
    way when CUDA_VISIBLE_DEVICES reorders them), and one read of its state."""

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise Unavailable(f"not sampled: {device} is not a CUDA device")
        try:
            import pynvml
        except ImportError as err:
            raise Unavailable("not sampled: nvidia-ml-py is not installed "
                               "(pip install nvidia-ml-py)") from err  # fmt: skip
        try:
            pynvml.nvmlInit()
            props = torch.cuda.get_device_properties(device)
            bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            self.handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
        except Exception as err:  # noqa: BLE001 (NVMLError and its many subclasses)
            raise Unavailable(f"not sampled: NVML: {type(err).__name__}: {err}") from err
        self.nvml = pynvml
        self.reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or (
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )

    def read(self) -> dict:
        nvml, handle = self.nvml, self.handle
        return {
            "sm_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "mem_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
            "power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
            "temp_c": nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            "slowdown": slowdown_names(self.reasons(handle)),
        }

    def max_sm_mhz(self) -> int:
        return int(self.nvml.nvmlDeviceGetMaxClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))


def open_reader(device: torch.device) -> NvmlReader:
    """NVML's reader of `device`'s state; Unavailable says why there is none."""
    return NvmlReader(device)


def max_sm_mhz(device: torch.device) -> int | None:
    """The SM clock's maximum NVML reports for the device, or None where NVML cannot be read."""
    try:
        return open_reader(device).max_sm_mhz()
    except Exception:  # noqa: BLE001 (Unavailable or an NVML error: no maximum to report)
        return None

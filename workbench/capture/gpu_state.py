"""What the GPU's clocks, power and temperature did while a bench's rows were timed.

Two `bench moe` runs on the H200 11 minutes apart, with the same kernels and the same timing
design, timed every row at T=33,863 0.9-7% apart (flat on bf16 experts 14.13 and 13.37 ms,
W8A8 9.65 and 9.03): the GPU's state, not the kernels. Rows timed in turns share that state,
so their ratios hold; a time, or a share of a ceiling measured minutes before, does not. So
while each group of rows is sampled in turns (`bench_rows.check_then_time`: from the first
round to the last, the warm-ups left out) a thread reads NVML (nvidia-ml-py) every
`INTERVAL_S`: SM and memory clocks, power draw, temperature, and the reasons NVML gives for
holding the clocks below their maximum. The bench keeps them as its `gpu_state` table, so a
reader can tell a slow kernel from a slow GPU (`analysis.gpu_state` summarises them).

`power_w` is NVML's power reading, which on Hopper is an average over the last second: it
lags the rounds it is read in and smooths their spikes. Reading NVML changes no setting of the
GPU. Where it cannot be read (a CPU run, no nvidia-ml-py, no NVML driver), the log says why
and stays empty: the bench still runs.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType, TracebackType

import torch

# A read every 0.1 s. A decode size's rounds take about 0.1 s, so two or three reads, whose
# power (a 1-second average) is mostly the warm-ups'; a prefill size's rounds take seconds.
INTERVAL_S = 0.1
JOIN_S = 10.0  # how long `stop` waits for a read in flight before giving NVML up
# NVML's clocks-event reason bits that hold the clocks down under load (nvmlClocksEventReason*).
# Left out: idle, sync boost and display clocks (none is set while a kernel runs) and
# application clocks (a setting, the same for every row; the environment records the clocks).
# hw-slowdown (0x8) is set together with hw-thermal and power-brake, so shares can overlap.
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
    """The samples taken from `start` to `stop` (dicts of COLUMNS, `t_s` from the start), or,
    in `unavailable`, why none or no more could be taken. Sampling runs in a daemon thread; as
    a context manager the log starts at enter and stops at exit."""

    device: torch.device
    interval_s: float = INTERVAL_S
    samples: list[dict] = field(default_factory=list)
    unavailable: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> None:
        """Begin sampling (once), or note why NVML cannot be read."""
        if self._thread is not None or self.unavailable:
            return
        try:
            reader = open_reader(self.device)
        except Unavailable as why:
            self.unavailable = str(why)
            return
        self._thread = threading.Thread(target=self._sample, args=(reader,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End sampling after one last read; a log never started stays empty. A read that
        hangs does not hang the bench: after JOIN_S the thread (a daemon) is left behind."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(JOIN_S)
            if self._thread.is_alive():
                self.unavailable = f"NVML did not answer within {JOIN_S:.0f} s"

    def __enter__(self) -> GpuStateLog:
        self.start()
        return self

    def __exit__(
        self, kind: type | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _sample(self, reader: NvmlReader) -> None:
        """One read now and every interval until stopped, then one more at the stop. A read
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
            self.reasons = _reasons_call(pynvml, self.handle)
        except Exception as err:  # noqa: BLE001 (NVMLError and its many subclasses)
            raise Unavailable(f"not sampled: NVML: {type(err).__name__}: {err}") from err
        self.nvml = pynvml

    def read(self) -> dict:
        """The device's state now, as COLUMNS but `t_s` (power in W, temperature in C)."""
        nvml, handle = self.nvml, self.handle
        return {
            "sm_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "mem_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
            "power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,  # mW, a 1-second average
            "temp_c": nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            "slowdown": slowdown_names(self.reasons(handle)),
        }

    def max_sm_mhz(self) -> int:
        """The most the SM clock can run at on this board (its boost clock)."""
        return int(self.nvml.nvmlDeviceGetMaxClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))


def _reasons_call(pynvml: ModuleType, handle: object) -> Callable[[object], int]:
    """NVML's clocks-event reasons query, tried once: the newer name where the driver has it,
    else the older one (drivers before 535 have only `...ThrottleReasons`)."""
    newer = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if newer is not None:
        try:
            newer(handle)
            return newer
        except pynvml.NVMLError_FunctionNotFound:
            pass
    older = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    older(handle)
    return older


@functools.cache
def open_reader(device: torch.device) -> NvmlReader:
    """The one NVML reader of `device`, opened on first use (one nvmlInit a device); raises
    Unavailable, with why, where there is none (that is not kept: a later call tries again).
    Tests replace it to stand in for NVML."""
    return NvmlReader(device)


def max_sm_mhz(device: torch.device) -> int | None:
    """The SM clock's maximum NVML reports for the device, or None where NVML cannot be read."""
    try:
        return open_reader(device).max_sm_mhz()
    except Exception:  # noqa: BLE001 (Unavailable or an NVML error: no maximum to report)
        return None

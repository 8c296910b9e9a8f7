"""The one timer of the workbench: how a launch is timed, and the record of how it was.

Every benchmark row, sweep row and A/B sample is timed here, the same way:
- warm-up: one call first (compiles, loads modules, creates handles); then, on a GPU, the
  launch replayed back to back for WARMUP_S. A GPU that has just been idle runs slower for a
  while: on the H200, flat FP8 MoE at T=6 read 0.196 ms for the first ~0.1 s of samples and
  0.180 from then on, abruptly, with or without the CPU held behind the GPU (so not launch
  latency), while nvidia-smi showed the SM clock at 1980 MHz throughout
  (raw/logs/h200-timer-warm-state-probe-*). A bench checks each row before timing it, which
  idles the GPU, so every decode row (100 samples take a few tens of ms) was timed in that
  slow state: about 8% over what a serving loop, which never idles, sees. With the warm
  period, bench moe read flat FP8 at T=6 0.175 ms against 0.192 in the run just before it
  without (raw/bench-moe-dsv4-flash-tp2-20261202T150239, ...T144908); its prefill rows
  (T=33,863) moved by -2% to +6%, as between earlier runs of the same kernels;
- on a GPU, CUDA events around each sample, after reading a buffer larger than any L2 so each
  sample starts from cold caches as a served step does: with clean lines, as the kernels
  before it leave L2 (they read far more weight bytes than they write). The timer used to
  write the buffer instead (`cache.zero_()`, as many benchmark harnesses do), which left L2
  full of dirty lines that the timed kernel had to write back: on the H200 that added 6-8 us
  to every sample, a tenth of a decode layer's dense GEMMs (64 MB read at 2.3 TB/s against
  2.8; raw/logs/h200-timer-flush-probe-3cf25bc-20261202T1131.csv);
- a CUDA graph of the launch is replayed, so the CPU's cost of launching kernels is not
  counted as kernel time: at decode sizes (tokens at or below GRAPH_TOKENS) by default, at
  every size for calls their caller knows are capture-safe (`graph=True`: the dense GEMMs,
  whose W8A8 layer at M=128 read 1.95 ms timed eagerly and 0.275 ms replayed with the same
  tiles on the H200), never for work with host-side control flow
  (`graph=False`: a peer that syncs on its routing); the profile is where launch cost shows;
- repeats until the median's 95% interval is tight or the budget is spent
  (`analysis.stats.adaptive_rounds`);
- contenders that are compared (a benchmark's rows at one size) are timed in turns, one
  sample of each per round, the rounds' orders a Williams design, all until all are done
  (`time_launches`, `analysis.stats.adaptive_rounds`):
  timed one after another, the same W8A8 layer read 1-3% faster when it was timed first at
  4,096 rows and up to 8% apart at 16,384 (raw/logs/h200-bench-dense-order-effect-*), a
  position effect as large as some of the ratios a bench reports;
- on the CPU (the interpreter's stand-in, for tests of this machinery): wall clock.
`Timing.method` says which of these ran, and goes into each artifact's metadata.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from workbench.analysis.stats import Repeats, adaptive_rounds, summarise

GRAPH_TOKENS = 48  # at or below: time CUDA graph replays
WARMUP_S = 0.5  # GPU busy with the launch before the first sample (module docstring)
L2_FLUSH_BYTES = 256 * 2**20  # larger than any L2 (H200: 60 MB)


# how a benchmark's rows at one size share the GPU, recorded in its metadata (module docstring)
CONTENDER_ORDER = (
    "in turns: one sample of each row at a size per round, the rounds' orders a Williams "
    "design (each place and each predecessor equally often a cycle), every row until all "
    "rows are done"
)
BENCH_REPEATS = Repeats(min_n=10, max_n=100, rel_width=0.02, budget_s=3.0)


@dataclass(frozen=True)
class Method:
    """How samples were taken (recorded in metadata beside the numbers)."""

    clock: str  # "cuda-events" or "wall-clock"
    cuda_graph: bool
    l2_flush_bytes: int
    l2_flush: str  # how the flush buffer is touched: "read" (module docstring), "" on the CPU
    warmup_calls: int
    warmup_s: float  # then the launch replayed back to back this long (0 on the CPU)
    repeats: Repeats

    def record(self) -> dict:
        return asdict(self)


@dataclass
class Timing:
    """Samples in ms, their summary, why repeating stopped, and the method."""

    samples_ms: list[float]
    stopped: str
    method: Method
    stats: dict = field(init=False)

    def __post_init__(self) -> None:
        self.stats = summarise(self.samples_ms)

    @property
    def median_ms(self) -> float:
        return self.stats["median"]

    @property
    def iqr_ms(self) -> float:
        return self.stats["q3"] - self.stats["q1"]


def method_for(
    device: torch.device,
    tokens: int,
    graph: bool | None = None,
    repeats: Repeats = BENCH_REPEATS,
) -> Method:
    """The method `time_launch` uses for this device and size: `graph` None replays a CUDA
    graph at decode sizes only, True at every size, False never (module docstring)."""
    cuda = device.type == "cuda"
    return Method(
        clock="cuda-events" if cuda else "wall-clock",
        cuda_graph=cuda and (tokens <= GRAPH_TOKENS if graph is None else graph),
        l2_flush_bytes=L2_FLUSH_BYTES if cuda else 0,
        l2_flush="read" if cuda else "",
        warmup_calls=1,
        warmup_s=WARMUP_S if cuda else 0.0,
        repeats=repeats,
    )


def sampler(
    launch: Launch, method: Method, device: torch.device, flush: torch.Tensor | None
) -> Callable[[], float]:
    """One timed call of `launch.fn` in ms per unit (`Launch.units`), after the warm-up
    `method` asks for; `flush` is the buffer read before each GPU sample (`flush_buffer`)."""
    fn, units = launch.fn, launch.units
    if method.clock != "wall-clock" and flush is None:
        raise ValueError("a GPU sample reads a flush buffer first: pass flush_buffer(...)")
    for _ in range(method.warmup_calls):
        fn()
    if method.clock == "wall-clock":

        def wall() -> float:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3 / units

        return wall
    torch.cuda.synchronize(device)
    replay = fn
    if method.cuda_graph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        replay = graph.replay
    _keep_busy(replay, method.warmup_s, device)

    def events() -> float:
        flush.sum()  # reads it all: L2 then holds its clean lines (module docstring)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / units

    return events


def flush_buffer(device: torch.device, methods: Sequence[Method]) -> torch.Tensor | None:
    """The buffer that a GPU sample reads first, as large as the methods ask
    (`Method.l2_flush_bytes`, larger than any L2); None where none asks for one (the CPU)."""
    nbytes = max((method.l2_flush_bytes for method in methods), default=0)
    if nbytes == 0:
        return None
    return torch.zeros(nbytes // 2, dtype=torch.bfloat16, device=device)


def _keep_busy(launch: Callable[[], object], seconds: float, device: torch.device) -> None:
    """Replay `launch` until `seconds` have passed, a few launches per synchronise, so the
    GPU stays busy (not idle between launches) and the CPU does not queue far ahead of it."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(4):
            launch()
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Launch:
    """What one contender times: `fn`, at `tokens` tokens, as a CUDA graph where `graph` says
    (as in `method_for`), its time reported per one of the `units` equal calls `fn` makes
    (a layer cycled through several copies of its weights: per copy)."""

    fn: Callable[[], object]
    tokens: int
    graph: bool | None = None
    units: int = 1


def time_launches(
    launches: Sequence[Launch],
    device: torch.device,
    repeats: Repeats = BENCH_REPEATS,
    on_rounds: Callable[[], object] | None = None,
) -> list[Timing | Exception]:
    """Time each launch by the workbench's one method, all of them in turns (module
    docstring): each is warmed up and captured first, then sampled round by round. A launch
    that fails (out of memory, a compile error) gets its exception in its place. `on_rounds`
    is called once the warm-ups are done, as the rounds begin (not at all when no launch got
    that far) (a bench starts reading the
    GPU's state there, so its readings are the rounds', not the warm-ups')."""
    methods = [method_for(device, launch.tokens, launch.graph, repeats) for launch in launches]
    flush = flush_buffer(device, methods)
    measures: list[Callable[[], float] | Exception] = []
    for launch, method in zip(launches, methods, strict=True):
        try:
            measures.append(sampler(launch, method, device, flush))
        except Exception as err:  # noqa: BLE001 (one failing contender must not stop the rest)
            measures.append(err)
    ready = [i for i, m in enumerate(measures) if not isinstance(m, Exception)]
    if on_rounds is not None and ready:
        on_rounds()
    sampled = adaptive_rounds([measures[i] for i in ready], **asdict(repeats))
    results: list[Timing | Exception] = list(measures)  # type: ignore[arg-type]
    for i, result in zip(ready, sampled, strict=True):
        results[i] = result if isinstance(result, Exception) else Timing(*result, methods[i])
    return results


def time_launch(
    fn: Callable[[], object],
    device: torch.device,
    tokens: int,
    graph: bool | None = None,
    repeats: Repeats = BENCH_REPEATS,
    units: int = 1,
) -> Timing:
    """Time `fn` alone by the workbench's one method (module docstring; `graph` as in
    `method_for`, `units` as in `Launch`)."""
    (timing,) = time_launches([Launch(fn, tokens, graph, units)], device, repeats)
    if isinstance(timing, Exception):
        raise timing
    return timing

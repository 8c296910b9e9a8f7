"""How much device memory a profile needs, checked before anything is allocated, and how much
the host has free.

The estimate is deliberately simple and a little generous: weights, the KV cache, the prompt's
hidden states, and the largest per-chunk temporaries (gathered keys for sparse attention, the
indexer's score rows, the MoE slot buffers). Its job is to turn a mid-run out-of-memory crash
into an up-front error that says how many tokens do fit.

The host's free memory is MemAvailable, or less where this process's memory cgroup (a
container's limit) leaves less: the kernel's OOM killer acts on whichever runs out first.
"""

from __future__ import annotations

from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.presets import Preset

GIB = 2**30
HEADROOM = 2 * GIB  # CUDA context, allocator slack, cuBLAS workspaces
INDEXER_QUERY_BLOCK = 512  # kernels.attention.indexer_scores' default query_block


def estimate_bytes(preset: Preset, prompt_tokens: int, chunk: int, streams: int = 1) -> int:
    """Bytes a profile of `prompt_tokens` in chunks of `chunk` needs on one device."""
    s = preset.rank_shapes()
    distinct = min(preset.distinct_weight_sets, preset.layers)
    weights = distinct * s.weight_bytes_per_layer() + s.vocab * s.hidden * 2
    cache = (prompt_tokens + streams) * s.cache_bytes_per_token(preset.layers)
    prompt = prompt_tokens * s.hidden * 2
    per_chunk_token = (
        s.top_k * (s.hidden * 4 + s.expert_intermediate * 2 * 2)  # MoE slot buffers
        + (s.index_topk + s.window) * s.head_dim * 2 * 2  # gathered latent keys, scores
        + prompt_tokens * 4 * 3  # indexer score row, masked copy, top-k temporaries
        + s.hidden * 2 * 12  # hidden-size activations alive at once
    )
    # The indexer scores one block of queries against every key at once: dots, relu, fp32.
    indexer_block = INDEXER_QUERY_BLOCK * s.index_heads * prompt_tokens * (2 + 2 + 4)
    return weights + cache + prompt + indexer_block + chunk * per_chunk_token + HEADROOM


def tokens_that_fit(preset: Preset, free_bytes: int, chunk: int | None, streams: int = 1) -> int:
    """The largest prompt that `estimate_bytes` says fits in `free_bytes` (0 if none)."""
    lo, hi = 0, 1 << 22
    while lo < hi:
        mid = (lo + hi + 1) // 2
        need = estimate_bytes(preset, mid, min(chunk or mid, mid), streams)
        lo, hi = (mid, hi) if need <= free_bytes else (lo, mid - 1)
    return lo


class NotEnoughMemoryError(WorkbenchError):
    """An estimate says the work does not fit, so it was refused before allocating; sweeps and
    A/B runs record it as status `oom`, like an allocation that failed."""


def _fields(path: Path) -> dict[str, str]:
    """`name value` lines of a /proc or cgroup file (a `name:` colon dropped); {} if unreadable."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    return {k.rstrip(":"): v for k, _, v in (line.partition(" ") for line in lines)}


def _cgroup_dirs() -> dict[str, Path]:
    """This process's memory cgroup directory, by hierarchy ('v2' unified, 'v1' memory)."""
    dirs = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return dirs
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            dirs["v2"] = Path("/sys/fs/cgroup" + path)
        elif "memory" in controllers.split(","):
            dirs["v1"] = Path("/sys/fs/cgroup/memory" + path)
    return {k: d for k, d in dirs.items() if d.is_dir()}


def _cgroup_room(dirs: dict[str, Path]) -> int | None:
    """What the memory cgroup's limit leaves (page cache it can drop counted as free), or None
    without a limit. Only the process's own cgroup is read, not its ancestors'."""
    files = {
        "v2": ("memory.max", "memory.current", "inactive_file"),
        "v1": ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
    }
    rooms = []
    for version, d in dirs.items():
        limit_file, usage_file, inactive = files[version]
        try:
            limit = (d / limit_file).read_text().strip()
            usage = int((d / usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:  # v1 writes "no limit" as ~2**63
            cache = int(_fields(d / "memory.stat").get(inactive, 0))
            rooms.append(int(limit) - usage + cache)
    return min(rooms, default=None)


def available_host_bytes() -> int | None:
    """The host memory free for new work: MemAvailable, or what the memory cgroup's limit
    leaves where that is less; None where /proc does not say."""
    available = _fields(Path("/proc/meminfo")).get("MemAvailable")
    if available is None:
        return None
    room = _cgroup_room(_cgroup_dirs())
    free = int(available.split()[0]) * 1024
    return free if room is None else max(0, min(free, room))


def oom_kill_counts() -> dict[str, int]:
    """How many processes the kernel's OOM killer has ended, per counter this process can read:
    the host's (/proc/vmstat) and its memory cgroup's (v2 memory.events, v1 memory.oom_control).
    A worker that died of SIGKILL while one of them rose was taken by the OOM killer."""
    dirs = _cgroup_dirs()
    sources = {"host": Path("/proc/vmstat")}
    if "v2" in dirs:
        sources["cgroup-v2"] = dirs["v2"] / "memory.events"
    if "v1" in dirs:
        sources["cgroup-v1"] = dirs["v1"] / "memory.oom_control"
    counts = {name: _fields(path).get("oom_kill") for name, path in sources.items()}
    return {name: int(n) for name, n in counts.items() if n is not None and n.isdigit()}


def out_of_memory_error(
    preset: Preset,
    prompt_tokens: int,
    chunk: int | None,
    free_bytes: int,
    streams: int = 1,
    where: str = "GPU",
) -> NotEnoughMemoryError:
    """The error to raise when a profile does not fit: what it needs and what would fit."""
    need = estimate_bytes(
        preset, prompt_tokens, min(chunk or prompt_tokens, prompt_tokens), streams
    )
    fit = tokens_that_fit(preset, free_bytes, chunk, streams)
    return NotEnoughMemoryError(
        f"out of {where} memory: a {prompt_tokens}-token profile of preset '{preset.name}' needs "
        f"about {need / GIB:.1f} GiB and {free_bytes / GIB:.1f} GiB is free; this preset fits "
        f"about {fit} prompt tokens with prefill_chunk={chunk}. Use fewer tokens, a smaller "
        f"prefill_chunk, or free the {where}."
    )

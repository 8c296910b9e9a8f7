"""How data is collected: torch profiler traces, ncu relaunches, event timing, workers."""

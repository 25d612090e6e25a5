"""Measuring the engine: benchmarks, statistics, results windows and the tools under tools/."""

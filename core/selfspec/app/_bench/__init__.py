"""Benchmarks, sweeps and plots on real data (``specdec bench``, ``specdec sweep``,
``specdec report``)."""

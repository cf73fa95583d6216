"""Side-by-side benchmarks shipped with the package (``python -m tensorxfer bench``).

``replay`` measures packing, the host transfer backend and cross-process
handoff against numpy, torch and multiprocessing baselines; ``report`` is the
shared helper for tables, ratios, JSON and PNG output.
"""

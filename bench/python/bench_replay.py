"""Replay benchmark (same as ``python -m tensorxfer bench``); ``--help`` lists the options.

pack_rows vs numpy.take / torch.index_select, the host transfer backend vs
numpy.copyto / torch copy_, and SlotRing handoff vs multiprocessing queues,
side by side in one run; prints a ratio table, writes JSON and PNG to --out.
"""

import sys

from tensorxfer.benchmarks.replay import main

if __name__ == "__main__":
    sys.exit(main(prog="bench_replay.py"))

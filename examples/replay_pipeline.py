"""Replay pipeline demo: collectors -> SlotRing -> learner on any device.

Same code and options as ``python -m tensorxfer demo`` (see
``tensorxfer/demo/replay_demo.py``); ``--help`` lists the options.  Example:

    python examples/replay_pipeline.py --seconds 10 --collectors 2 --device cpu
"""

import sys

from tensorxfer.demo import limit_blas_threads

if __name__ == "__main__":
    limit_blas_threads()  # before numpy is imported
    from tensorxfer.demo.replay_demo import main

    sys.exit(main(prog="replay_pipeline.py"))

"""Resharding demo: ranks move a sharded model's weights to another layout through each copy service.

Same code and options as ``python -m tensorxfer reshard-demo`` (see
``tensorxfer/demo/reshard_demo.py``); ``--help`` lists the options.  Example:

    python examples/reshard.py --ranks 4 --total-mib 64 --backends torch,local
"""

import sys

from tensorxfer.demo import limit_blas_threads

if __name__ == "__main__":
    limit_blas_threads()  # before numpy is imported
    from tensorxfer.demo.reshard_demo import main

    sys.exit(main(prog="reshard.py"))

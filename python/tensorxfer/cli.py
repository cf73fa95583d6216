"""Command line: ``python -m tensorxfer info | demo | reshard-demo | bench`` (also the ``tensorxfer`` script).

``info`` reports the build and the machine, ``demo`` runs the replay pipeline
demo (:mod:`tensorxfer.demo.replay_demo`), ``reshard-demo`` the resharding demo
(:mod:`tensorxfer.demo.reshard_demo`), ``bench`` runs the replay benchmark
(:mod:`tensorxfer.benchmarks.replay`).  ``demo``, ``reshard-demo`` and ``bench``
take the same options as their modules; ``<command> --help`` lists them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

_COMMANDS = {
    "info": "print the version, what was compiled in and what is usable now",
    "demo": "run the replay pipeline demo (collectors -> SlotRing -> learner)",
    "reshard-demo": "move a sharded model's weights to another layout through each copy service",
    "bench": "run the replay benchmark against its baselines",
}


def _top_level_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tensorxfer",
        description="tensorxfer: move tensors for training and inference jobs.",
        epilog="Run '<command> --help' for the options of a command.",
    )
    parser.add_argument("command", choices=sorted(_COMMANDS), metavar="command",
                        help="; ".join(f"{name}: {text}" for name, text in _COMMANDS.items()))
    return parser


def _info_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tensorxfer info", description=_COMMANDS["info"])
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    from tensorxfer._info import main_info

    return main_info(as_json=args.json)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        _top_level_parser().print_help(sys.stderr)
        return 2
    if argv[0] not in _COMMANDS:
        _top_level_parser().parse_args(argv[:1])  # help, or a usage error naming the choices
        return 2
    command, rest = argv[0], argv[1:]
    if command == "info":
        return _info_main(rest)
    if command == "demo":
        from tensorxfer.demo import limit_blas_threads

        limit_blas_threads()
        from tensorxfer.demo.replay_demo import main as demo_main

        return demo_main(rest, prog="python -m tensorxfer demo")
    if command == "reshard-demo":
        from tensorxfer.demo.reshard_demo import main as reshard_main

        return reshard_main(rest, prog="python -m tensorxfer reshard-demo")
    from tensorxfer.benchmarks.replay import main as bench_main

    return bench_main(rest, prog="python -m tensorxfer bench")


if __name__ == "__main__":
    sys.exit(main())

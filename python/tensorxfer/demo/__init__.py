"""The demos: replay pipeline (``python -m tensorxfer demo``) and resharding (``python -m tensorxfer reshard-demo``).

Replay: ``replay_demo`` has the options, ``run_demo`` and the summary;
``learner`` the learner loop; ``collector`` the collector processes; ``store``
the shared replay store, the batch format and the independent verification.

Resharding: ``reshard_demo`` has the options, ``run_demo`` and the summary;
``reshard_launch`` starts a backend's ranks and judges their reports;
``reshard_worker`` is one rank; ``reshard_model`` the synthetic model, the
layouts, the task plan and the independent verification.
"""

import os as _os


def limit_blas_threads() -> None:
    """Runs BLAS single-threaded in this process unless the user chose otherwise.

    The learner's compute step is a small matmul; with the collectors busy on
    the other cores, a multi-threaded BLAS spins against them and runs 10-30x
    slower.  Environment variables only take effect before numpy is imported,
    so the entry points call this first.
    """
    for variable in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        _os.environ.setdefault(variable, "1")

"""One rank of torch's own distributed suite (``DistributedTest``), case after case, in one process.

``python torch_suite_ranks.py RANK RESULTS_JSON CASES_JSON``, with the environment torch's suite
reads (``BACKEND``, ``WORLD_SIZE``, ``TEMP_DIR``, ``INIT_METHOD``) set by test_torch_suite.py.

torch drives the suite with ``MultiProcessTestCase``: a fresh set of spawned processes for every
case. Here the ranks start once per backend and world size and run every case in turn, each on a
process group of its own (a new file store, a new ``TEMP_DIR`` for the suite's file barrier), as
torch's ``TestDistBackend._run`` sets one up. ``CASES_JSON`` is ``{"cases": [...], "run_anyway":
[...], "capabilities": [...]}``: ``capabilities`` are the ``DistTestCases.backend_feature`` sets this
backend joins before the suite is imported (its decorators read them then); ``run_anyway`` the cases
run despite a static skip that names other backends only (the test says why for each);
``cpu_branch`` the cases whose body picks its devices by backend name (``if BACKEND == "gloo"``: a
CPU model): they read the suite's ``BACKEND`` as ``"gloo"`` while the process group stays this
backend's. Each rank
writes ``{case: {"outcome": "passed"|"skipped"|"failed", "detail": str, "seconds": float}}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import unittest
import warnings
from datetime import timedelta
from typing import Any, Dict, List

#: How long a rank waits in the suite's file barrier after a case (the ranks of a failed case
#: may be out of step; the next case starts on a new process group either way).
AFTER_CASE_BARRIER_S = 20


def _suite_class(capabilities: List[str]) -> Any:
    import tensorxfer  # noqa: F401 - registers the "tensorxfer" backend in this process
    from torch.testing._internal.common_distributed import DistTestCases

    backend = os.environ["BACKEND"]
    for feature in capabilities:
        DistTestCases.backend_feature.setdefault(feature, set()).add(backend)
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

    class Suite(TestDistBackend, DistributedTest._DistTestBase):  # type: ignore[misc,valid-type]
        pass

    return Suite


def _skip_message(code: Any) -> str:
    from torch.testing._internal.common_distributed import TEST_SKIPS

    for skip in TEST_SKIPS.values():
        if skip.exit_code == code:
            return skip.message
    return f"exit code {code}"


def _case_directory(root: str, index: int) -> str:
    path = os.path.join(root, f"case-{index}")
    for sub in ("barrier", "test_dir", "init_dir"):
        os.makedirs(os.path.join(path, sub), exist_ok=True)
    return path


def _run_case(suite: Any, name: str, index: int, rank: int, world: int, root: str, cpu_branch: bool) -> Dict[str, Any]:
    import torch.distributed as dist
    from torch.testing._internal import common_utils
    from torch.testing._internal.distributed import distributed_test

    # Cases decorated with_dist_debug_levels leave TORCH_DISTRIBUTED_DEBUG at their last level (the
    # suite gets a fresh process per case): DETAIL left over wraps DDP's group and crashes it.
    os.environ.pop("TORCH_DISTRIBUTED_DEBUG", None)
    dist.set_debug_level_from_env()
    case = suite(name)
    case.rank = rank
    os.environ["TEMP_DIR"] = _case_directory(root, index)
    distributed_test.Barrier.barrier_id = 0
    case.file_name = os.path.join(os.environ["TEMP_DIR"], "store")
    timeout = distributed_test.CUSTOM_PG_TIMEOUT.get(name, distributed_test.default_pg_timeout)
    dist.init_process_group(init_method=case.init_method, backend=os.environ["BACKEND"], world_size=world,
                            rank=rank, timeout=timedelta(seconds=timeout))
    case._barrier()
    common_utils.set_rng_seed()
    backend = distributed_test.BACKEND
    try:
        if cpu_branch:
            distributed_test.BACKEND = "gloo"
        getattr(case, name)()
        result = {"outcome": "passed", "detail": ""}
    except unittest.SkipTest as skip:
        result = {"outcome": "skipped", "detail": str(skip)}
    except SystemExit as leaving:  # the suite's runtime skips leave with a code of TEST_SKIPS
        result = {"outcome": "skipped", "detail": _skip_message(leaving.code)}
    except BaseException:  # noqa: BLE001 - reported to the test, which fails on it
        result = {"outcome": "failed", "detail": traceback.format_exc()}
    finally:
        distributed_test.BACKEND = backend
    try:
        case._barrier(wait_for=world, timeout=AFTER_CASE_BARRIER_S)  # the case may have destroyed the group
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return result


def main(argv: List[str]) -> int:
    rank, results_path, cases_path = int(argv[0]), argv[1], argv[2]
    with open(cases_path) as file:
        spec = json.load(file)
    warnings.simplefilter("ignore")
    suite = _suite_class(spec["capabilities"])
    world = int(os.environ["WORLD_SIZE"])
    root = os.environ["TEMP_DIR"]
    results: Dict[str, Any] = {}
    for index, name in enumerate(spec["cases"]):
        method = getattr(suite, name)
        started = time.monotonic()
        if getattr(method, "__unittest_skip__", False) and name not in spec["run_anyway"]:
            results[name] = {"outcome": "skipped", "detail": getattr(method, "__unittest_skip_why__", "")}
        else:
            try:
                results[name] = _run_case(suite, name, index, rank, world, root, name in spec["cpu_branch"])
            except BaseException:  # noqa: BLE001 - set-up or the after-case barrier: the case failed
                results[name] = {"outcome": "failed", "detail": traceback.format_exc()}
        results[name]["seconds"] = time.monotonic() - started
        print(f"rank {rank}: {name}: {results[name]['outcome']} ({results[name]['seconds']:.1f} s)", flush=True)
    with open(results_path, "w") as file:
        json.dump(results, file)
    sys.stdout.flush()
    os._exit(0)  # as the suite's ranks do: no interpreter teardown racing gloo's threads


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

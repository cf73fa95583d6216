"""Which modules are public, and a check that the API reference documents every name they export.

Every module of the package whose dotted name has no part starting with ``_`` is listed
below, either as public (each name in its ``__all__`` must appear in the API reference)
or as internal, with the reason. ``tests/python/test_docs_reference.py`` fails when a
module is in neither list, so a new module is classified when it is added.

A name counts as documented when the reference has an entry of that full name, or an
entry with the same last component for the very same object: ``tensorxfer.ipc.SlotRing``
documents ``tensorxfer.ipc.slot_ring.SlotRing``, the class it re-exports. Sphinx reports a
missing name as a warning, which ``scripts/docs.sh`` (``-W``) turns into a failure.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, Iterable, List, Tuple

PUBLIC_MODULES = [
    "tensorxfer",
    "tensorxfer.errors",
    "tensorxfer.ipc",
    "tensorxfer.ipc.pack",
    "tensorxfer.ipc.shared_array",
    "tensorxfer.ipc.slot_ring",
    "tensorxfer.ipc.remote",
    "tensorxfer.ipc.replay_pipelines",
    "tensorxfer.ipc.replay_pipelines.base",
    "tensorxfer.ipc.replay_pipelines.transfer",
    "tensorxfer.ipc.replay_pipelines.transfer.base",
    "tensorxfer.ipc.replay_pipelines.transfer.cuda_like",
    "tensorxfer.ipc.replay_pipelines.transfer.factory",
    "tensorxfer.ipc.replay_pipelines.transfer.host",
    "tensorxfer.ipc.replay_pipelines.transfer.torch_copy",
    "tensorxfer.ipc.replay_pipelines.transfer.xpu",
    "tensorxfer.inference",
    "tensorxfer.inference.unified_memory",
    "tensorxfer.runtime",
    "tensorxfer.runtime.collectives",
    "tensorxfer.runtime.cuda_collectives",
    "tensorxfer.runtime.group",
    "tensorxfer.runtime.ipc_memory",
    "tensorxfer.resharding",
    "tensorxfer.resharding.copy_services",
    "tensorxfer.resharding.copy_services.base",
    "tensorxfer.resharding.copy_services.factory",
    "tensorxfer.resharding.copy_services.local",
    "tensorxfer.resharding.copy_services.mpi",
    "tensorxfer.resharding.copy_services.shm",
    "tensorxfer.resharding.copy_services.torch_distributed",
    "tensorxfer.resharding.megatron",
    "tensorxfer.resharding.persistent_plan",
    "tensorxfer.resharding.pipeline_executor",
    "tensorxfer.resharding.schedule",
    "tensorxfer.distributed",
]

_CLI = "the command line (python -m tensorxfer ...): documented as commands in Getting started"
_REMOTE = "the implementation behind tensorxfer.ipc.remote, which exports its public names"
_BACKEND = "the torch.distributed backend's implementation: users reach it through torch.distributed"
_PLANNING = "one step of the copy services' planning, private to the services (developing guide)"
INTERNAL_MODULES: Dict[str, str] = {
    "tensorxfer.cli": _CLI,
    "tensorxfer.benchmarks": _CLI + " (python -m tensorxfer bench)",
    "tensorxfer.benchmarks.handoff": _CLI + " (python -m tensorxfer bench)",
    "tensorxfer.benchmarks.replay": _CLI + " (python -m tensorxfer bench)",
    "tensorxfer.benchmarks.report": _CLI + " (python -m tensorxfer bench)",
    "tensorxfer.demo": _CLI + " (python -m tensorxfer demo | reshard-demo)",
    "tensorxfer.demo.collector": _CLI + " (the demo's collectors)",
    "tensorxfer.demo.learner": _CLI + " (the demo's learner)",
    "tensorxfer.demo.remote_collector": _CLI + " (the demo's collector on another host)",
    "tensorxfer.demo.remote_hosts": _CLI + " (the demo's simulated hosts)",
    "tensorxfer.demo.replay_demo": _CLI + " (python -m tensorxfer demo)",
    "tensorxfer.demo.reshard_demo": _CLI + " (python -m tensorxfer reshard-demo)",
    "tensorxfer.demo.reshard_launch": _CLI + " (the resharding demo's launcher)",
    "tensorxfer.demo.reshard_model": _CLI + " (the resharding demo's synthetic model)",
    "tensorxfer.demo.reshard_worker": _CLI + " (the resharding demo's ranks)",
    "tensorxfer.demo.store": _CLI + " (the replay demo's store)",
    "tensorxfer.ipc.remote.learner": _REMOTE,
    "tensorxfer.ipc.remote.producer": _REMOTE,
    "tensorxfer.ipc.remote.protocol": _REMOTE + " (the wire format)",
    "tensorxfer.ipc.remote.rendezvous": _REMOTE + " (the rendezvous store)",
    "tensorxfer.ipc.remote.handshake": _REMOTE + " (admission: version, records, the token's HMAC)",
    "tensorxfer.ipc.remote.relay": _REMOTE + " (one producer's session, in the relay host)",
    "tensorxfer.ipc.remote.relay_host": _REMOTE + " (the process that runs the sessions)",
    "tensorxfer.ipc.remote.relay_host_main": _REMOTE + " (the relay host's entry point)",
    "tensorxfer.distributed.cross_host": _BACKEND,
    "tensorxfer.distributed.failures": _BACKEND,
    "tensorxfer.distributed.hierarchical": _BACKEND,
    "tensorxfer.distributed.other_devices": _BACKEND,
    "tensorxfer.distributed.process_group": _BACKEND + " (TensorxferProcessGroup is documented "
                                            "under tensorxfer.distributed)",
    "tensorxfer.distributed.reduce_ops": _BACKEND,
    "tensorxfer.distributed.scratch": _BACKEND,
    "tensorxfer.distributed.topology": _BACKEND,
    "tensorxfer.runtime.host_probe": "which ranks share a host (shared memory), for the backend and the copy services",
    "tensorxfer.distributed.torch_private": _BACKEND + " (the one private torch import)",
    "tensorxfer.distributed.work": _BACKEND,
    "tensorxfer.resharding.copy_services.planning": _PLANNING,
    "tensorxfer.resharding.copy_services.planning.coalescing": _PLANNING,
    "tensorxfer.resharding.copy_services.planning.matching": _PLANNING,
    "tensorxfer.resharding.copy_services.planning.plan_cache": _PLANNING,
    "tensorxfer.resharding.copy_services.planning.windows": _PLANNING,
    "tensorxfer.resharding.cuda_pipeline": "the CUDA half of PipelineExecutor (tensorxfer.resharding."
                                           "pipeline_executor), chosen by DoubleBufferManager(device=...)",
    "tensorxfer.resharding.native_batch": "the pipeline executor's conversion of batches to native rows",
}


def exported_names(module_name: str) -> List[Tuple[str, Any]]:
    """(name, object) for every name in the module's ``__all__`` (lazy names resolved)."""
    module = importlib.import_module(module_name)
    return [(name, getattr(module, name)) for name in getattr(module, "__all__", [])]


def _resolve(full_name: str) -> Tuple[bool, Any]:
    """(found, object) for a documented dotted name: a module attribute or a class member."""
    parts = full_name.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for part in parts[split:]:
                target = getattr(target, part)
        except AttributeError:
            return False, None
        return True, target
    return False, None


def missing_names(documented: Iterable[str], modules: Iterable[str] = PUBLIC_MODULES) -> List[str]:
    """The ``module.name`` of every exported name of ``modules`` that no documented entry covers."""
    documented = set(documented)
    by_last: Dict[str, List[Any]] = {}
    for full_name in documented:
        found, target = _resolve(full_name)
        if found:
            by_last.setdefault(full_name.rpartition(".")[2], []).append(target)
    missing = []
    for module_name in modules:
        for name, value in exported_names(module_name):
            full_name = f"{module_name}.{name}"
            if full_name in documented:
                continue
            if any(candidate is value for candidate in by_last.get(name, [])):
                continue
            missing.append(full_name)
    return missing


def _check(app: Any, env: Any) -> None:
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    # Not the aliases a canonical name adds: they exist only beside the entry they point to.
    documented = [name for name, entry in env.get_domain("py").objects.items() if not entry.aliased]
    for full_name in missing_names(documented):
        logger.warning("API reference: %s is in __all__ of a public module but has no entry "
                       "(add it to a page under docs/reference/)", full_name,
                       type="reference", subtype="coverage")


def setup(app: Any) -> Dict[str, Any]:
    app.connect("env-check-consistency", _check)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

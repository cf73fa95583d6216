"""Megatron-LM's refit on a persistent plan.

megatron-core's ``execute_reshard_plan(plan, src, dst, service)`` runs on any tensorxfer
copy service as it is (tensorxfer's services are Megatron ``CopyService`` instances once
Megatron is imported). It pays three copies of its own per op every refit
(``.contiguous()`` of each source slice, temporary receive buffers, the write-back after
``run()``) and a submit per op. :func:`build_refit_plan` takes the same ``ReshardPlan``
and modules and returns a :class:`~tensorxfer.resharding.persistent_plan.PersistentPlan`
whose runs move each slice in place, from the source parameter into the destination
parameter::

    from megatron.core.resharding import build_centralized_reshard_plan
    from tensorxfer.resharding.megatron import build_refit_plan

    reshard_plan = build_centralized_reshard_plan(src_model, dst_model)   # Megatron's planner
    refit = build_refit_plan(reshard_plan, src_model, dst_model, service)  # once, collective
    for step in range(steps):
        train_step(src_model)
        refit.run(version=step)                                            # every step

The plan holds views of the parameters' ``.data``: the parameters must keep their storage
(update them in place, as optimizers do; do not reassign ``param.data``). Megatron is not
imported by this module.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from tensorxfer.resharding.persistent_plan import SERVICE_TIMEOUT, PersistentPlan, build_persistent_plan


def refit_ops(reshard_plan: Any, src_module: Any, dst_module: Any) -> Tuple[List[Any], List[Any]]:
    """(sends, recvs) of a Megatron ReshardPlan as (task_id, parameter slice, peer) tuples.

    The ops execute_reshard_plan submits (ops of parameters a module does not have are
    skipped, as there), with views of the parameters instead of copies.

    Args:
        reshard_plan: Megatron's ``ReshardPlan``.
        src_module: the module whose parameters are sent.
        dst_module: the module whose parameters receive.

    Returns:
        ``(sends, recvs)``, lists of ``(task_id, parameter slice, peer)`` tuples.
    """
    src_params: Dict[str, Any] = dict(src_module.named_parameters(recurse=True))
    dst_params: Dict[str, Any] = dict(dst_module.named_parameters(recurse=True))
    sends = [(op.task_id, src_params[op.param_name].data[op.my_slice], op.peer_rank)
             for op in reshard_plan.send_ops if op.param_name in src_params]
    recvs = [(op.task_id, dst_params[op.param_name].data[op.my_slice], op.peer_rank)
             for op in reshard_plan.recv_ops if op.param_name in dst_params]
    return sends, recvs


def build_refit_plan(reshard_plan: Any, src_module: Any, dst_module: Any, service: Any,
                     timeout: Any = SERVICE_TIMEOUT) -> PersistentPlan:
    """A persistent plan of Megatron's ``ReshardPlan`` between the two modules.

    Collective: every rank of the service calls it.

    Args:
        reshard_plan: Megatron's ``ReshardPlan``, from
            ``build_centralized_reshard_plan(src_module, dst_module)``.
        src_module: the module whose parameters are sent.
        dst_module: the module whose parameters receive.
        service: a tensorxfer copy service.
        timeout: as for
            :func:`~tensorxfer.resharding.persistent_plan.build_persistent_plan`.

    Returns:
        The :class:`~tensorxfer.resharding.persistent_plan.PersistentPlan`; call its
        ``run()`` every step.

    Raises:
        TypeError: ``reshard_plan`` is not Megatron's ReshardPlan (no ``send_ops`` /
            ``recv_ops``).
    """
    for field in ("send_ops", "recv_ops"):
        if not hasattr(reshard_plan, field):
            raise TypeError(f"reshard_plan: expected Megatron's ReshardPlan (send_ops, recv_ops), got "
                            f"{type(reshard_plan).__name__}")
    sends, recvs = refit_ops(reshard_plan, src_module, dst_module)
    return build_persistent_plan(service, sends, recvs, timeout)


__all__ = ["build_refit_plan", "refit_ops"]

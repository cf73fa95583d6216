"""Inference-time memory placement.

``tensorxfer.inference.unified_memory`` provides managed memory pools, prefetch
and placement advice for CUDA managed tensors and for host tensors (populate,
NUMA placement, page-aligned host pools).
"""

from tensorxfer.inference import unified_memory

__all__ = ["unified_memory"]

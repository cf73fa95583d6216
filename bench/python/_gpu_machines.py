"""The two machines the CUDA cases of ``bench_gpu.py`` run on, behind one small interface:

* ``TorchGpu``: a real GPU, through torch.cuda and tensorxfer's CUDA classes
  (``CudaLikeReplayTransferBackend``, ``TorchCopyReplayTransferBackend``, the unified mempool,
  ``CudaCommunicator``).
* ``FakeGpu``: the fake CUDA runtime of ``tests/cuda_fake`` (``$TENSORXFER_BENCH_FAKE_CUDA=1``, the
  extension built by ``scripts/gpu_bench.sh --fake-cuda``) with a CPU-only torch. torch.cuda does not
  exist there, so "device" tensors are host tensors and the torch-level CUDA classes are replaced by
  stand-ins over the fake core's CUDA entry points (``CudaCopySubmitter``, ``cuda_host_register``,
  managed memory and its prefetch, ``IpcMemory(device="cuda")`` across two processes). The numbers
  mean nothing: it checks that the cases, their launches and their report run end to end.

Import this module before anything imports tensorxfer: with the fake selected, it loads the fake
extension as ``tensorxfer._core`` first (in every spawned rank too, which imports it to unpickle its
target).
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import Any, List, Optional

REPO = Path(__file__).resolve().parents[2]
FAKE_ENV = "TENSORXFER_BENCH_FAKE_CUDA"
FAKE = os.environ.get(FAKE_ENV) == "1"
if FAKE:
    sys.path.insert(0, str(REPO / "tests" / "cuda_fake" / "python"))
    from fake_core_loader import install  # noqa: E402

    install()


class TorchGpu:
    """GPU 0 through torch.cuda and tensorxfer's CUDA classes."""

    fake = False

    def __init__(self) -> None:
        import torch

        from tensorxfer import _core

        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False: no GPU (use --fake-cuda to test the script)")
        torch.cuda.set_device(0)
        self.torch = torch
        self.name = torch.cuda.get_device_name(0)
        self.device = torch.device("cuda", 0)
        self._submitter = _core.CudaCopySubmitter(0)

    def empty(self, count: int, dtype: Any = None) -> Any:
        return self.torch.empty(count, dtype=dtype or self.torch.uint8, device=self.device)

    def pinned(self, nbytes: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=True)

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def memcpy_h2d(self, dst: Any, src: Any, nbytes: int) -> None:
        """cudaMemcpyAsync(dst, src, nbytes) on torch's current stream (the native submitter's one call)."""
        self._submitter.copy_host_to_device(dst.data_ptr(), src.data_ptr(), nbytes,
                                            self.torch.cuda.current_stream().cuda_stream)

    def to_device(self, tensor: Any) -> Any:
        return tensor.to(self.device, non_blocking=True)

    def replay_backend(self, ring_depth: int) -> Any:
        from tensorxfer.ipc.replay_pipelines.transfer import build_replay_transfer_backend

        return build_replay_transfer_backend(device="cuda", ring_depth=ring_depth)

    def torch_copy_backend(self, ring_depth: int) -> Any:
        from tensorxfer.ipc.replay_pipelines.transfer import TorchCopyReplayTransferBackend

        return TorchCopyReplayTransferBackend(device="cuda", ring_depth=ring_depth)

    def managed_module(self, nbytes: int, pieces: int) -> tuple[Any, Any]:
        """A module of ``pieces`` float32 parameters, ``nbytes`` in all, in the unified mempool."""
        from tensorxfer.inference import unified_memory as um

        pool = um.create_unified_mempool()
        with self.torch.cuda.use_mem_pool(pool):
            module = _parameter_module(self.torch, nbytes, pieces, self.device)
        return module, pool

    def managed_tensor(self, pool: Any, nbytes: int) -> Any:
        with self.torch.cuda.use_mem_pool(pool):
            return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)

    def plain_module(self, nbytes: int, pieces: int) -> Any:
        return _parameter_module(self.torch, nbytes, pieces, self.device)

    def module_to(self, module: Any, where: str) -> None:
        module.to(self.device if where == "gpu" else "cpu")

    def first_touch(self, tensor: Any) -> None:
        tensor.fill_(1)

    def communicator(self, group: Any) -> Any:
        from tensorxfer.runtime import CudaCommunicator

        return CudaCommunicator(group)

    def close(self) -> None:
        pass


class FakeGpu:
    """The fake CUDA runtime: host memory and stand-ins over the fake core (see the module docstring)."""

    fake = True
    name = "fake CUDA runtime (tests/cuda_fake)"

    def __init__(self) -> None:
        import torch

        from tensorxfer import _core

        if not hasattr(_core, "fake_cuda"):
            raise RuntimeError(f"{FAKE_ENV}=1 but tensorxfer._core ({_core.__file__}) is not the fake build")
        self.torch = torch
        self.core = _core
        self.device = torch.device("cpu")
        self._submitter = _core.CudaCopySubmitter(0)
        self._registered: List[int] = []
        self._allocations: List[int] = []  # fake cudaMalloc'd, freed by close()
        self._library = ctypes.CDLL(_core.__file__)
        self._library.tensorxfer_uvm_malloc.restype = ctypes.c_void_p
        self._library.tensorxfer_uvm_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]

    def empty(self, count: int, dtype: Any = None) -> Any:
        """``count`` elements of fake device memory (cudaMalloc: the fake checks copy directions against it)."""
        dtype = dtype or self.torch.uint8
        nbytes = count * self.torch.empty((), dtype=dtype).element_size()
        pointer = ctypes.c_void_p()
        error = self._library.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(max(nbytes, 1)))
        if error != 0 or not pointer.value:
            raise MemoryError(f"fake cudaMalloc({nbytes}) failed with error {error}")
        self._allocations.append(pointer.value)
        return self._host_view(pointer.value, nbytes).view(dtype)

    def _host_view(self, address: int, nbytes: int) -> Any:
        import numpy as np

        return self.torch.from_numpy(np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address)))

    def pinned(self, nbytes: int) -> Any:
        tensor = self.torch.empty(nbytes, dtype=self.torch.uint8)
        if self.core.cuda_host_register(tensor.data_ptr(), nbytes, 0):
            self._registered.append(tensor.data_ptr())
        return tensor

    def synchronize(self) -> None:
        pass  # the fake runs queued work at once

    def memcpy_h2d(self, dst: Any, src: Any, nbytes: int) -> None:
        self._submitter.copy_host_to_device(dst.data_ptr(), src.data_ptr(), nbytes, 0)

    def to_device(self, tensor: Any) -> Any:
        return tensor.clone()

    def replay_backend(self, ring_depth: int) -> Any:
        return _FakeReplayBackend(self, native=True)

    def torch_copy_backend(self, ring_depth: int) -> Any:
        return _FakeReplayBackend(self, native=False)

    def _managed(self, nbytes: int) -> Any:
        pointer = self._library.tensorxfer_uvm_malloc(nbytes, 0, None)
        if not pointer:
            raise MemoryError(f"tensorxfer_uvm_malloc({nbytes}) failed")
        return self._host_view(pointer, nbytes)  # never freed: it lives until the process ends

    def managed_module(self, nbytes: int, pieces: int) -> tuple[Any, Any]:
        module = self.torch.nn.Module()
        piece = nbytes // pieces
        module.weights = self.torch.nn.ParameterList(
            [self.torch.nn.Parameter(self._managed(piece).view(self.torch.float32), requires_grad=False)
             for _ in range(pieces)])
        return module, None

    def managed_tensor(self, pool: Any, nbytes: int) -> Any:
        return self._managed(nbytes)

    def plain_module(self, nbytes: int, pieces: int) -> Any:
        return _parameter_module(self.torch, nbytes, pieces, self.device)

    def module_to(self, module: Any, where: str) -> None:
        for parameter in module.parameters():  # a move allocates and copies, as .to() does on a GPU
            parameter.data = parameter.data.clone()

    def first_touch(self, tensor: Any) -> None:
        tensor.fill_(1)

    def communicator(self, group: Any) -> Any:
        return _FakeCommunicator(group)

    def close(self) -> None:
        for pointer in self._registered:
            self.core.cuda_host_unregister(pointer, 0)
        self._registered.clear()
        for pointer in self._allocations:  # after the case: no tensor of it is used any more
            self._library.cudaFree(ctypes.c_void_p(pointer))
        self._allocations.clear()


class _FakeReplayBackend:
    """The replay backends' calls over the fake: the native submitter, or a torch copy."""

    h2d_submitter = "fake"

    def __init__(self, gpu: FakeGpu, native: bool) -> None:
        self.gpu, self.native = gpu, native

    def register_host_slots(self, slots: List[Any]) -> None:
        for slot in slots:
            if self.native and self.gpu.core.cuda_host_register(slot.data_ptr(), slot.numel(), 0):
                self.gpu._registered.append(slot.data_ptr())

    def allocate_device_slots(self, *, count: int, shape: Any, dtype: Any) -> List[Any]:
        return [self.gpu.empty(int(shape[0]), dtype).zero_() for _ in range(count)]

    def submit_h2d(self, *, slot: int, dst: Any, src: Any, h2d_bytes: Optional[int] = None) -> float:
        nbytes = dst.numel() * dst.element_size() if h2d_bytes is None else h2d_bytes
        if self.native:
            self.gpu.memcpy_h2d(dst, src, nbytes)
        else:
            dst.view(-1)[:nbytes].copy_(src.view(-1)[:nbytes])
        return 0.0

    def synchronize_ready(self, slot: int) -> None:
        pass

    def close(self) -> None:
        pass


class _FakeCommunicator:
    """CudaCommunicator's calls over the fake: the CUDA IpcMemory it maps (fake CUDA IPC across the
    two processes) and the host Communicator's sum (the fake build has no CUDA kernels)."""

    def __init__(self, group: Any) -> None:
        from tensorxfer.runtime import Communicator, IpcMemory

        self._memory = IpcMemory.create(group, 1 << 20, "cuda:0", timeout=60)
        self._host = Communicator(group)

    def all_reduce(self, tensor: Any) -> Any:
        return self._host.all_reduce(tensor)

    def close(self) -> None:
        self._host.close()
        self._memory.close()


def _parameter_module(torch: Any, nbytes: int, pieces: int, device: Any) -> Any:
    module = torch.nn.Module()
    count = nbytes // pieces // 4
    module.weights = torch.nn.ParameterList(
        [torch.nn.Parameter(torch.ones(count, dtype=torch.float32, device=device), requires_grad=False)
         for _ in range(pieces)])
    return module


def make_gpu() -> Any:
    return FakeGpu() if FAKE else TorchGpu()



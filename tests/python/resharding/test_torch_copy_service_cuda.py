"""TorchDistributedCopyService with nccl on CUDA tensors (needs a CUDA device).

One GPU allows one nccl rank (nccl refuses two ranks on one device), so the
group has one rank: every task is a local copy between CUDA tensors, through
the same submit/run/plan-reuse path as a larger group. Runs in a child process,
so the process group and a crash stay out of the test process.
"""

from __future__ import annotations

import pytest

from child_process import run_child

torch = pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.timeout(210),  # above the child's own 180 s
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"),
    pytest.mark.skipif(torch.cuda.is_available() and not torch.distributed.is_nccl_available(),
                       reason="this torch build has no nccl"),
]

NCCL_ONE_RANK = """\
import datetime
import torch
import torch.distributed as dist
from tensorxfer.resharding.copy_services import build_copy_service

dist.init_process_group("nccl", init_method="file://{store}", rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda", 0))
service = build_copy_service("torch", timeout=60)
assert service.requires_process_group_barrier is True, "nccl's wait is stream-ordered"
dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8]
sizes = [1, 3, 1024, 1 << 20]  # small ones go packed, the large one alone
sources, targets = [], []
for index, (dtype, numel) in enumerate((d, n) for d in dtypes for n in sizes):
    source = (torch.arange(numel, device="cuda") % 97 + index).to(dtype)
    sources.append(source)
    targets.append(torch.zeros_like(source))
for repeat in range(3):  # the second and third run reuse the plan
    for tensor in targets:
        tensor.zero_()
    for task, (source, target) in enumerate(zip(sources, targets)):
        service.submit_send(source, 0, task_id=task)
        service.submit_recv(target, 0, task_id=task)
    service.run()
    torch.cuda.synchronize()
    for task, (source, target) in enumerate(zip(sources, targets)):
        assert target.device.type == "cuda" and torch.equal(target, source), (repeat, task)
service.close()
dist.destroy_process_group()
print("ok")
"""


def test_nccl_group_copies_cuda_tensors_and_reuses_the_plan(tmp_path):
    result = run_child(NCCL_ONE_RANK.format(store=tmp_path / "store"), timeout=180)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-4000:]

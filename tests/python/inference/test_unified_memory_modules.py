"""Module helpers on torch.nn.Modules whose parameters live in the host pool."""

from __future__ import annotations

import pytest
from unified_memory_helpers import kernel_numa_refusal, numa_policy, page_count, resident_pages

from tensorxfer import _core
from tensorxfer.inference import unified_memory as um

torch = pytest.importorskip("torch", reason="torch is not installed (pip install .[torch])")
nn = torch.nn


def fresh_parameter(pool, *shape):
    """A parameter in pool memory that no one has touched (no page resident)."""
    return nn.Parameter(pool.empty(shape, torch.float32), requires_grad=True)


def pooled_model(pool):
    """Linear(256->512) + BatchNorm(512), all storage fresh pool memory."""
    model = nn.Sequential(nn.Linear(256, 512), nn.BatchNorm1d(512))
    model[0].weight = fresh_parameter(pool, 512, 256)
    model[0].bias = fresh_parameter(pool, 512)
    model[1].weight = fresh_parameter(pool, 512)
    model[1].bias = fresh_parameter(pool, 512)
    model[1].running_mean = pool.empty((512,), torch.float32)
    model[1].running_var = pool.empty((512,), torch.float32)
    return model


def test_prefetch_module_parameters_populates_them_and_returns_their_bytes():
    with um.create_host_mempool() as pool:
        model = pooled_model(pool)
        params = list(model.parameters())
        buffers = [model[1].running_mean, model[1].running_var]
        assert all(resident_pages(t) == 0 for t in params + buffers)

        total = um.prefetch_managed_module_parameters(model, device=-1)
        assert total == sum(p.nbytes for p in params) == (512 * 256 + 3 * 512) * 4
        assert all(resident_pages(p) == page_count(p) for p in params)
        assert all(resident_pages(b) == 0 for b in buffers), "buffers were not asked for"

        with_buffers = um.prefetch_managed_module_parameters(model, device=-1, include_buffers=True)
        buffer_bytes = sum(b.nbytes for b in model.buffers() if b.numel() > 0)
        assert with_buffers == total + buffer_bytes
        assert all(resident_pages(b) == page_count(b) for b in buffers)


def test_tied_and_empty_parameters_count_once_or_not_at_all():
    with um.create_host_mempool() as pool:
        encoder = nn.Embedding(100, 64)
        decoder = nn.Linear(64, 100, bias=False)
        encoder.weight = fresh_parameter(pool, 100, 64)
        decoder.weight = encoder.weight  # tied
        model = nn.ModuleDict({"encoder": encoder, "decoder": decoder})
        model.register_parameter("nothing", nn.Parameter(torch.empty(0)))
        assert um.prefetch_managed_module_parameters(model, device=-1) == 100 * 64 * 4


def test_adopted_module_keeps_values_parameters_and_ties():
    model = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.Linear(64, 32))
    model[2].weight = nn.Parameter(model[0].weight.detach().t().contiguous())
    model.eval()
    inputs = torch.randn(8, 32)
    expected = model(inputs)
    weight_param = model[0].weight
    with um.create_host_mempool() as pool:
        assert pool.adopt_module(model) is model
        assert model[0].weight is weight_param, "Parameter objects are kept"
        for tensor in list(model.parameters()) + list(model.buffers()):
            if tensor.numel() > 0:
                assert pool.block_of(tensor) is not None
        torch.testing.assert_close(model(inputs), expected)
        assert um.prefetch_managed_module_parameters(model, device=-1, include_buffers=True) > 0


def test_adopt_keeps_tied_weights_tied():
    encoder, decoder = nn.Embedding(10, 8), nn.Linear(8, 10, bias=False)
    decoder.weight = encoder.weight
    model = nn.ModuleList([encoder, decoder])
    with um.create_host_mempool() as pool:
        pool.adopt_module(model)
        assert model[0].weight is model[1].weight
        assert pool.block_of(model[1].weight) is not None


def test_advise_module_prefers_the_local_node_for_parameters_only():
    if kernel_numa_refusal():
        pytest.skip(kernel_numa_refusal())
    with um.create_host_mempool() as pool:
        model = pooled_model(pool)
        assert um.advise_managed_module_parameters_preferred_location(model, device=-1) is None
        for param in model.parameters():
            assert numa_policy(param)["mode"] == "preferred"
        assert numa_policy(model[1].running_mean)["mode"] == "default"
        um.advise_managed_module_parameters_preferred_location(model, device=-1, include_buffers=True)
        assert numa_policy(model[1].running_mean)["mode"] == "preferred"


def test_module_helpers_validate_their_arguments():
    model = nn.Linear(4, 4)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        um.prefetch_managed_module_parameters([torch.ones(3)], device=-1)
    with pytest.raises(TypeError, match="include_buffers"):
        um.prefetch_managed_module_parameters(model, device=-1, include_buffers="yes")
    with pytest.raises(ValueError, match="device"):
        um.advise_managed_module_parameters_preferred_location(model, device=-5)
    meta = nn.Linear(4, 4, device="meta")
    with pytest.raises(ValueError, match="device meta"):
        um.prefetch_managed_module_parameters(meta, device=-1)


def test_module_on_a_gpu_id_without_a_gpu_says_why():
    if _core.cuda_status()["device_count"] > 0:
        pytest.skip("a CUDA device is present: covered by test_unified_memory_cuda.py")
    with pytest.raises(um.UnifiedMemoryUnsupportedError, match="no CUDA device is usable"):
        um.prefetch_managed_module_parameters(nn.Linear(4, 4), device=0)

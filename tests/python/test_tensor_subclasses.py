# SPDX-License-Identifier: BSD-3-Clause
"""Tensor subclasses: one that overrides __torch_dispatch__ keeps its data in tensors
inside it, which lucid-amp's kernels cannot reach, so the scaler, lucid_amp.clip_grad_norm_
and the fused optimizers refuse it by name before any kernel runs (never a crash). DTensor
(FSDP2's fully_shard, tensor parallelism) is the exception for the scaler and clipping,
which work on its local shards; the fused optimizers refuse it too. A subclass of
nn.Parameter with plain storage (FSDP1's FlatParameter) works as a Parameter."""

import pytest
import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map

import lucid_amp
import lucid_amp.optim


class Wrapper(torch.Tensor):
    """The smallest __torch_dispatch__ subclass: its data lives in ``inner``."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, dtype=inner.dtype, device=inner.device,
            requires_grad=inner.requires_grad)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t.inner if isinstance(t, Wrapper) else t  # noqa: E731
        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        return tree_map(lambda t: Wrapper(t) if isinstance(t, torch.Tensor) else t, out)


class PlainSubclass(torch.nn.Parameter):
    """An nn.Parameter subclass with ordinary storage, as FSDP1's FlatParameter."""


def scaled_scaler():
    scaler = lucid_amp.GradScaler("cpu", init_scale=4.0)
    scaler.scale(torch.ones(()))  # the scale exists
    return scaler


CALLS = {
    "unscale_": lambda s, opt: s.unscale_(opt),
    "step": lambda s, opt: s.step(opt),
    "clip_grad_norm_": lambda s, opt: s.clip_grad_norm_(opt, 1.0),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_dispatch_subclass_gradient_is_refused_by_name(call):
    p = torch.nn.Parameter(torch.ones(3))
    q = torch.nn.Parameter(torch.ones(2))
    q.grad = Wrapper(torch.full((2,), 8.0))
    p.grad = torch.full((3,), 8.0)
    opt = torch.optim.SGD([{"params": [p]}, {"params": [q]}], lr=0.1)
    scaler = scaled_scaler()
    with pytest.raises(NotImplementedError,
                       match=r"parameter 0 of param group 1.*overrides __torch_dispatch__"):
        CALLS[call](scaler, opt)
    assert torch.equal(p.grad, torch.full((3,), 8.0))  # nothing was unscaled
    assert torch.equal(q.grad.inner, torch.full((2,), 8.0))
    assert torch.equal(p.detach(), torch.ones(3)) and torch.equal(q.detach(), torch.ones(2))


def test_clip_grad_norm_refuses_a_dispatch_subclass_gradient():
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = Wrapper(torch.full((2,), 3.0))
    with pytest.raises(NotImplementedError, match="parameter 0.*__torch_dispatch__"):
        lucid_amp.clip_grad_norm_([p], 1.0)
    assert torch.equal(p.grad.inner, torch.full((2,), 3.0))


@pytest.mark.parametrize("cls", ["FusedSGD", "FusedAdam", "FusedAdamW"])
def test_fused_optimizers_refuse_a_dispatch_subclass_parameter(cls):
    p = torch.nn.Parameter(Wrapper(torch.ones(4)))
    p.grad = Wrapper(torch.full((4,), 0.5))
    opt = getattr(lucid_amp.optim, cls)([p], lr=0.1)
    with pytest.raises(NotImplementedError, match="parameter 0.*__torch_dispatch__"):
        opt.step()
    assert torch.equal(p.inner, torch.ones(4))


def test_a_parameter_subclass_with_plain_storage_works_as_a_parameter():
    torch.manual_seed(0)
    plain = torch.nn.Parameter(torch.randn(5))
    sub = PlainSubclass(plain.detach().clone())
    results = []
    for param in (plain, sub):
        opt = torch.optim.SGD([param], lr=0.1)
        scaler = lucid_amp.GradScaler("cpu", init_scale=2.0**8)
        scaler.scale((param * param).sum()).backward()
        scaler.step(opt)
        scaler.update()
        results.append(param.detach().clone())
    assert torch.equal(results[0], results[1])


def test_dtensor_gradients_are_unscaled_through_their_local_shards_as_pytorchs():
    """A DTensor parameter and gradient on a one-process gloo mesh (what fully_shard
    makes): both scalers unscale it, the DTensor gradient sees the result, and the step
    runs on the DTensor parameter (test_fsdp.py trains such models on several ranks)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group of the test's own")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = dist.device_mesh.init_device_mesh("cpu", (1,))
        for placement in (Replicate(), Shard(0)):
            params = []
            for scaler in (torch.amp.GradScaler("cpu", init_scale=4.0),
                           lucid_amp.GradScaler("cpu", init_scale=4.0)):
                p = torch.nn.Parameter(distribute_tensor(torch.ones(4), mesh, [placement]))
                p.grad = distribute_tensor(torch.full((4,), 8.0), mesh, [placement])
                scaler.scale(torch.ones(()))
                opt = torch.optim.SGD([p], lr=0.1)
                scaler.unscale_(opt)
                assert torch.equal(p.grad.to_local(), torch.full((4,), 2.0))
                scaler.step(opt)
                scaler.update()
                params.append(p.to_local().detach())
            assert torch.equal(params[0], params[1])
            assert torch.equal(params[1], torch.full((4,), 0.8))
    finally:
        dist.destroy_process_group()

# SPDX-License-Identifier: BSD-3-Clause
"""lucid_amp.ShardedGradScaler against PyTorch's FSDP1 ShardedGradScaler: the same
constructor, the same results in one process, and FSDP1 (FullyShardedDataParallel) models
in Gloo groups of 2 processes (and 4 in the slow tier) trained step by step under both,
with an overflow on one rank only and a NaN in one shard."""

import math
import pickle

import gloo_ranks
import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchShardedGradScaler

import lucid_amp

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="this PyTorch has no Gloo")

IMPLS = {"torch": TorchShardedGradScaler, "lucid_amp": lucid_amp.ShardedGradScaler}


@pytest.fixture
def world_of_one(tmp_path):
    """A Gloo group of this process alone, removed after the test."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_the_constructor_takes_pytorchs_arguments_in_pytorchs_order(impl):
    # backoff_factor comes before growth_factor, unlike GradScaler's order.
    scaler = IMPLS[impl]("cpu", 8.0, 0.25, 4.0, 7)
    assert scaler.get_backoff_factor() == 0.25
    assert scaler.get_growth_factor() == 4.0
    assert scaler.get_growth_interval() == 7
    assert scaler.process_group is dist.group.WORLD


def test_it_is_a_lucid_amp_grad_scaler_with_its_guards():
    scaler = lucid_amp.ShardedGradScaler("cpu", min_scale=1.0, hysteresis=2)
    assert isinstance(scaler, lucid_amp.GradScaler)
    assert scaler.state_dict()["hysteresis"] == 2


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_disabled_it_keeps_no_process_group_and_passes_outputs_through(impl):
    scaler = IMPLS[impl]("cpu", enabled=False)
    assert not hasattr(scaler, "process_group")
    loss = torch.ones(2, dtype=torch.float16)
    assert scaler.scale(loss) is loss


def test_scaled_outputs_keep_their_dtype_as_pytorchs():
    outputs = [torch.full((2,), 3.0, dtype=torch.float16),
               (torch.full((), 2.0, dtype=torch.bfloat16), torch.full((1,), 1.0, dtype=torch.float64))]
    ours = lucid_amp.ShardedGradScaler("cpu", init_scale=4.0).scale(outputs)
    theirs = TorchShardedGradScaler("cpu", init_scale=4.0).scale(outputs)
    assert type(ours) is list and type(ours[1]) is tuple
    for a, b in zip([ours[0], *ours[1]], [theirs[0], *theirs[1]]):
        assert a.dtype == b.dtype
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="outputs must be a Tensor or an iterable"):
        lucid_amp.ShardedGradScaler("cpu").scale([torch.ones(1), 3])


@pytest.mark.usefixtures("world_of_one")
@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_an_inf_gradient_skips_the_step_and_backs_off(impl):
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = IMPLS[impl]("cpu", init_scale=2.0)
    scaler.scale(torch.ones(()))
    p.grad = torch.tensor([1.0, math.inf, 2.0])
    assert scaler.step(opt) is None
    scaler.update()
    assert torch.equal(p.detach(), torch.ones(3))
    assert scaler.get_scale() == 1.0


@pytest.mark.usefixtures("world_of_one")
@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_sparse_gradients_are_unscaled_and_checked_through_their_values(impl):
    i = torch.tensor([[0, 1, 1], [2, 0, 2]])
    p = torch.nn.Parameter(torch.zeros(2, 3))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = IMPLS[impl]("cpu", init_scale=2.0)
    scaler.scale(torch.ones(()))
    p.grad = torch.sparse_coo_tensor(i, torch.tensor([16.0, 32.0, 64.0]), (2, 3))
    scaler.unscale_(opt)
    assert torch.equal(p.grad.to_dense(),
                       torch.sparse_coo_tensor(i, torch.tensor([8.0, 16.0, 32.0]), (2, 3)).to_dense())
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0
    p.grad = torch.sparse_coo_tensor(i, torch.tensor([16.0, 32.0, math.inf]), (2, 3))
    before = p.detach().clone()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(p.detach(), before)
    assert scaler.get_scale() == 1.0


@pytest.mark.usefixtures("world_of_one")
def test_a_pickled_scaler_agrees_over_the_default_group_again():
    scaler = lucid_amp.ShardedGradScaler("cpu", init_scale=4.0)
    scaler.scale(torch.ones(()))
    copy = pickle.loads(pickle.dumps(scaler))
    assert copy.process_group is dist.group.WORLD
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=1.0)
    copy.scale(torch.ones(()))
    p.grad = torch.full((2,), 4.0)
    copy.step(opt)
    copy.update()
    assert copy._agreement.all_reduces == 1
    assert torch.equal(p.detach(), torch.zeros(2))


SCENARIOS = "full_shard,shard_grad_op_orig_params,mixed_precision,fsdp_clip,scaler_clip,resume"


def run_ranks(tmp_path, world):
    return gloo_ranks.run_ranks("fsdp1_worker.py", tmp_path, world, SCENARIOS)


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_fsdp1_training_matches_pytorchs_sharded_grad_scaler_step_by_step(tmp_path, world):
    ranks = run_ranks(tmp_path, world)
    # The worker puts an inf into rank 1's shard at step 2 and a NaN into rank 0's at step 5.
    expected_skips = [step in (2, 5) for step in range(8)]
    for rank, scenarios in enumerate(ranks):
        assert sorted(scenarios) == sorted(SCENARIOS.split(","))
        for name, run in scenarios.items():
            theirs, ours = run["torch"], run["lucid"]
            where = f"rank {rank}, {name}"
            assert theirs["skips"] == expected_skips, where  # the reference agrees too
            assert ours["skips"] == theirs["skips"], where
            assert ours["scales"] == theirs["scales"], where
            assert ours["scales"] == ranks[0][name]["lucid"]["scales"], where
            for step, (a, b) in enumerate(zip(ours["losses"], theirs["losses"])):
                assert a == pytest.approx(b, rel=1e-5, abs=1e-6), f"{where}, loss at step {step}"
            for step, (a, b) in enumerate(zip(ours["params"], theirs["params"])):
                assert a == pytest.approx(b, rel=1e-5, abs=1e-6), f"{where}, parameters after step {step}"
            for step, (a, b) in enumerate(zip(ours["norms"], theirs["norms"])):
                if b is None or not math.isfinite(b):
                    assert a == b or (a is not None and not math.isfinite(a)), f"{where}, norm at step {step}"
                else:
                    assert a == pytest.approx(b, rel=1e-5), f"{where}, norm at step {step}"

# SPDX-License-Identifier: BSD-3-Clause
"""lucid_amp.GradScaler on DTensor parameters against torch.amp.GradScaler("cpu"): FSDP2
(fully_shard) models in Gloo groups of 2 processes, and HSDP, FSDP + tensor parallelism
and a parameter sharded over a flattened 2 x 2 mesh (its gradient placed as it, or
Replicate) in groups of 4 (slow tier), trained step by step under both with an overflow in
one rank's shard only and a NaN in another's; clipping (the scaler's and the free
function) gives PyTorch's norm with PyTorch's collectives; a scaler checkpoint moves
mid-run."""

import math

import gloo_ranks
import pytest
import torch
import torch.distributed as dist

import lucid_amp
import lucid_amp.optim

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="this PyTorch has no Gloo")

FAST = "fsdp,fsdp_clip_resume,fsdp_free_clip_bound,fsdp_mixed_fused,fsdp_uneven"
SLOW = "hsdp,hsdp_clip,fsdp_tp,fsdp_tp_clip,flat_mesh,flat_mesh_other_grad"


def skips_expected(scenario, rank):
    """The worker puts an inf into rank 1's shard at step 2 and a NaN into rank 0's at step
    5. PyTorch's scaler agrees over the mesh dimensions a gradient is sharded on: every rank
    of FSDP and of FSDP + TP (both dimensions sharded), but in HSDP only the ranks of one
    replica (ranks 0 and 1: the shard dimension), not the replicate dimension; and for a
    gradient that is Replicate on every dimension (its parameter sharded), no other rank."""
    if scenario.startswith("hsdp") and rank >= 2:
        return [False] * 8
    if scenario == "flat_mesh_other_grad":
        return [(step, rank) in ((2, 1), (5, 0)) for step in range(8)]
    return [step in (2, 5) for step in range(8)]


def check(ranks, names):
    for rank, scenarios in enumerate(ranks):
        assert sorted(scenarios) == sorted(names.split(","))
        for name, run in scenarios.items():
            theirs, ours = run["torch"], run["lucid"]
            where = f"rank {rank}, {name}"
            assert theirs["skips"] == skips_expected(name, rank), where  # the reference agrees too
            assert ours["skips"] == theirs["skips"], where
            assert ours["scales"] == theirs["scales"], where
            for step, (a, b) in enumerate(zip(ours["losses"], theirs["losses"])):
                assert a == pytest.approx(b, rel=1e-5, abs=1e-6), f"{where}, loss at step {step}"
            for step, (a, b) in enumerate(zip(ours["params"], theirs["params"])):
                assert a == pytest.approx(b, rel=1e-5, abs=1e-6), f"{where}, parameters after step {step}"
            for step, (a, b) in enumerate(zip(ours["norms"], theirs["norms"])):
                if b is None:
                    assert a is None, where
                    continue
                assert (a["type"], a["placements"]) == (b["type"], b["placements"]), where
                if math.isfinite(b["value"]):
                    assert a["value"] == pytest.approx(b["value"], rel=1e-5), f"{where}, norm at step {step}"
                else:
                    assert not math.isfinite(a["value"]), f"{where}, norm at step {step}"
            # The collectives between backward and the step's end: PyTorch's (the agreement
            # and the clipping's), plus, where bound, the user's hook once per step.
            bound = name.endswith("_bound")
            assert ours["collectives"] == [n + bound for n in theirs["collectives"]], (
                f"{where}: lucid_amp's collectives {ours['collective_ops'][0]}, "
                f"PyTorch's {theirs['collective_ops'][0]} (first step)")
            if bound:
                assert ours["all_reduces"] == 8, where


def test_fsdp2_training_matches_pytorchs_scaler_step_by_step(tmp_path):
    check(gloo_ranks.run_ranks("fsdp_worker.py", tmp_path, 2, FAST), FAST)


@pytest.mark.slow
def test_hsdp_and_fsdp_with_tensor_parallelism_match_pytorchs_scaler_step_by_step(tmp_path):
    check(gloo_ranks.run_ranks("fsdp_worker.py", tmp_path, 4, SLOW), SLOW)


@pytest.fixture
def mesh_of_one(tmp_path):
    """A Gloo group of this process alone and its 1-D mesh, removed after the test."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield dist.device_mesh.init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


@pytest.mark.parametrize("cls", ["FusedSGD", "FusedAdam", "FusedAdamW"])
def test_fused_optimizers_refuse_dtensor_parameters_naming_the_alternative(mesh_of_one, cls):
    from torch.distributed.tensor import Shard, distribute_tensor

    p = torch.nn.Parameter(distribute_tensor(torch.ones(4), mesh_of_one, [Shard(0)]))
    q = torch.nn.Parameter(torch.ones(2))
    alternative = rf"parameter 0 of param group {{}}.*DTensor.*torch\.optim's {cls[len('Fused'):]}"
    with pytest.raises(NotImplementedError, match=alternative.format(0)):
        getattr(lucid_amp.optim, cls)([p], lr=0.1)
    opt = getattr(lucid_amp.optim, cls)([q], lr=0.1)
    with pytest.raises(NotImplementedError, match=alternative.format(1)):
        opt.add_param_group({"params": [p]})
    assert len(opt.param_groups) == 1  # the refused group is not kept
    q.grad = torch.ones(2)
    opt.step()


def test_the_flag_is_agreed_over_the_mesh_dimensions_a_gradient_is_sharded_on(mesh_of_one):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from lucid_amp import _dtensor

    mesh = dist.device_mesh.init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
    p = torch.nn.Parameter(distribute_tensor(torch.ones(4), mesh, [Replicate(), Shard(0)]))
    q = torch.nn.Parameter(distribute_tensor(torch.ones(2), mesh, [Replicate(), Replicate()]))
    opt = torch.optim.SGD([p, q], lr=0.1)
    # Without gradients, the parameters' placements count (every rank joins alike).
    assert _dtensor.agreement_groups(opt) == [mesh.get_group("shard")]
    p.grad = distribute_tensor(torch.ones(4), mesh, [Replicate(), Shard(0)])
    q.grad = distribute_tensor(torch.ones(2), mesh, [Replicate(), Replicate()])
    assert _dtensor.agreement_groups(opt) == [mesh.get_group("shard")]


def test_an_overflow_in_a_dtensor_gradient_is_reported_by_its_name(mesh_of_one):
    from torch.distributed.tensor import Shard, distribute_tensor

    p = torch.nn.Parameter(distribute_tensor(torch.ones(4), mesh_of_one, [Shard(0)]))
    scaler = lucid_amp.GradScaler("cpu", init_scale=4.0)
    scaler.set_parameter_names([("layer.weight", p)])
    opt = torch.optim.SGD([p], lr=0.1)
    scaler.scale(torch.ones(()))
    p.grad = distribute_tensor(torch.tensor([1.0, math.inf, 2.0, 3.0]), mesh_of_one, [Shard(0)])
    assert scaler.step(opt) is None
    scaler.update()
    assert torch.equal(p.to_local(), torch.ones(4))
    (grad,) = scaler.last_overflow().gradients
    assert (grad.name, grad.inf_count, grad.numel) == ("layer.weight", 1, 4)


def test_clipping_dtensor_gradients_gives_pytorchs_norm_and_lucid_amps_argument_checks(mesh_of_one):
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    p = torch.nn.Parameter(distribute_tensor(torch.ones(4), mesh_of_one, [Shard(0)]))
    p.grad = distribute_tensor(torch.full((4,), 3.0), mesh_of_one, [Shard(0)])
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = lucid_amp.GradScaler("cpu", init_scale=2.0)
    scaler.scale(torch.ones(()))
    for call in (lambda: lucid_amp.clip_grad_norm_([p], 0.0),
                 lambda: scaler.clip_grad_norm_(opt, 1.0, norm_type=-1.0)):
        with pytest.raises(ValueError, match="Nothing was clipped"):
            call()
    assert scaler.stage(opt) == "ready"
    assert torch.equal(p.grad.to_local(), torch.full((4,), 3.0))
    norm = scaler.clip_grad_norm_(opt, 1.0)  # of the unscaled gradient, 1.5 each
    assert isinstance(norm, DTensor)
    assert norm.full_tensor().item() == pytest.approx(3.0)
    assert torch.allclose(p.grad.to_local(), torch.full((4,), 0.5))
    assert scaler.stage(opt) == "unscaled"

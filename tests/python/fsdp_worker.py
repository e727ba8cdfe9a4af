# SPDX-License-Identifier: BSD-3-Clause
"""One rank of test_fsdp.py: trains a small model whose parameters are DTensors (FSDP2's
fully_shard on a 1-D mesh; HSDP and FSDP + tensor parallelism on a 2 x 2 mesh) on the CPU
in a Gloo group, once under torch.amp.GradScaler("cpu") and once under
lucid_amp.GradScaler("cpu"), from the same weights on the same data, for each scenario,
and prints per scenario and scaler what happened at each step as JSON (last line).

Every scenario puts an inf into rank 1's local gradient shard only (step 2) and a NaN into
one element of rank 0's (step 5): a scaler that agrees over other ranks than PyTorch's
(or over none) decides differently from it on some rank."""

import json
import math
import pickle
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode

import lucid_amp
import lucid_amp.distributed

STEPS = 8
INF_STEP, INF_RANK = 2, 1
NAN_STEP, NAN_RANK = 5, 0
RESUME_AT = 4

# name: (layout, optimizer, clipping, resume, bind): layout "fsdp" (1-D mesh of the world;
# "fsdp_mixed": computing in bfloat16, gradients reduced and kept in float32;
# "fsdp_uneven": a last layer of one output, sharded unevenly),
# "hsdp" (2 x 2: replicate x shard), "fsdp_tp" (2 x 2: fully_shard over dp, tensor
# parallelism over tp), "flat_mesh" (no model: one parameter sharded on both dimensions of a
# 2 x 2 mesh that is also flattened into one, over which DTensor then all-reduces in one
# collective; "flat_mesh_other_grad": its gradient placed otherwise than it); clipping None, "scaler" (scaler.clip_grad_norm_ for lucid-amp's)
# or "free" (lucid_amp.clip_grad_norm_ after unscale_); bind: lucid-amp's scaler also
# has lucid_amp.distributed's agreement over the world as its found-inf hook.
SCENARIOS = {
    "fsdp": ("fsdp", "sgd", None, False, False),
    "fsdp_clip_resume": ("fsdp", "adam", "scaler", True, False),
    "fsdp_free_clip_bound": ("fsdp", "sgd", "free", False, True),
    "fsdp_mixed_fused": ("fsdp_mixed", "adam_fused", None, False, False),
    "fsdp_uneven": ("fsdp_uneven", "sgd", "scaler", False, False),
    "hsdp": ("hsdp", "sgd", None, False, False),
    "hsdp_clip": ("hsdp", "adam", "scaler", False, False),
    "fsdp_tp": ("fsdp_tp", "sgd", None, False, False),
    "fsdp_tp_clip": ("fsdp_tp", "adam", "scaler", False, False),
    "flat_mesh": ("flat_mesh", "sgd", None, False, False),
    "flat_mesh_other_grad": ("flat_mesh_other_grad", "sgd", None, False, False),
}


def outputs(layout):
    """The model's width of output: 1 for "fsdp_uneven", whose last layer's bias then has
    no element on rank 1 and its weight one row on rank 0 only (shards of unequal size)."""
    return 1 if layout == "fsdp_uneven" else 4


def build(layout, optimizer, world):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
        torch.nn.Linear(16, outputs(layout)))
    if layout in ("fsdp", "fsdp_mixed", "fsdp_uneven"):
        from torch.distributed.fsdp import MixedPrecisionPolicy

        mesh = init_device_mesh("cpu", (world,))
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if layout == "fsdp_mixed" else MixedPrecisionPolicy())
        for layer in (model[0], model[2], model[4]):
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
    elif layout == "hsdp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
        fully_shard(model, mesh=mesh)
    else:
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)

        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        # Every layer tensor-parallel: torch.nn.utils.clip_grad_norm_ refuses gradients on
        # different meshes (a layer on the dp mesh alone beside ones on dp x tp).
        parallelize_module(model, mesh["tp"], {
            "0": ColwiseParallel(), "2": RowwiseParallel(),
            "4": ColwiseParallel(output_layouts=Replicate())})
        fully_shard(model, mesh=mesh["dp"])
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=optimizer == "adam_fused")
    return model, opt


def local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def local_flat(model):
    return torch.cat([local(p.detach()).reshape(-1).double() for p in model.parameters()])


def norm_record(norm):
    if norm is None:
        return None
    if isinstance(norm, DTensor):
        return {"type": "DTensor", "placements": [str(p) for p in norm.placements],
                "value": float(norm.full_tensor())}
    return {"type": type(norm).__name__, "placements": None, "value": float(norm)}


class FlatMeshModel(torch.nn.Module):
    """One 8 x 8 weight sharded on both dimensions of a 2 x 2 mesh flattened also into one;
    the loss is the sum of weight * x, with x the same on every rank (and placed as the
    weight, so that the gradient is sharded as the weight is)."""

    def __init__(self, world, x_as_weight):
        super().__init__()
        self.x_as_weight = x_as_weight
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("a", "b"))
        mesh["a", "b"]._flatten("a_b")
        torch.manual_seed(0)
        self.weight = torch.nn.Parameter(
            distribute_tensor(torch.randn(8, 8), mesh, [Shard(0), Shard(1)]))
        self.mesh = mesh

    def forward(self, x, y):
        from torch.distributed.tensor import Replicate, distribute_tensor

        placements = self.weight.placements if self.x_as_weight else [Replicate(), Replicate()]
        x = distribute_tensor(x.repeat(2, 2)[:8, :8], self.mesh, placements)
        return (self.weight * x).sum().full_tensor() - y.sum()


def train(impl, scenario, rank, world):
    layout, optimizer, clip, resume, bind = SCENARIOS[scenario]
    if layout.startswith("flat_mesh"):
        model = FlatMeshModel(world, x_as_weight=layout == "flat_mesh")
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        model, opt = build(layout, optimizer, world)
    ours = impl == "lucid"
    make = lucid_amp.GradScaler if ours else torch.amp.GradScaler
    scaler = make("cpu", init_scale=2.0**10, growth_interval=3)
    agreement = lucid_amp.distributed.bind_to_group(scaler) if ours and bind else None
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    record = {"scales": [], "skips": [], "norms": [], "losses": [], "params": [], "collectives": [],
              "collective_ops": []}
    for step in range(STEPS):
        if resume and step == RESUME_AT:
            # The scaler's state (pickled, as torch.save does) moves into a new scaler.
            state = pickle.loads(pickle.dumps(scaler.state_dict()))
            scaler = make("cpu", init_scale=1.0, growth_interval=3)
            scaler.load_state_dict(state)
        opt.zero_grad(set_to_none=True)
        x = torch.randn(4, 6, generator=data)
        y = torch.randn(4, outputs(layout), generator=data)
        if layout.startswith("flat_mesh"):
            loss = model(x, y) ** 2
        else:
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        loss_value = loss.detach()
        scaler.scale(loss).backward()
        grads = [local(p.grad) for p in model.parameters() if p.grad is not None and local(p.grad).numel()]
        if step == INF_STEP and rank == INF_RANK:
            grads[-1].view(-1)[0] = math.inf
        if step == NAN_STEP and rank == NAN_RANK:
            grads[0].view(-1)[-1] = math.nan
        before = local_flat(model)
        norm = None
        # The collectives from the gradients to the step: the agreement and the clipping's.
        with CommDebugMode() as comms:
            if clip == "scaler" and ours:
                norm = scaler.clip_grad_norm_(opt, 1.0)
            elif clip is not None:
                scaler.unscale_(opt)
                clip_fn = lucid_amp.clip_grad_norm_ if ours else torch.nn.utils.clip_grad_norm_
                norm = clip_fn(model.parameters(), 1.0)
            scaler.step(opt)
        scaler.update()
        record["collectives"].append(comms.get_total_counts())
        record["collective_ops"].append({str(op): n for op, n in comms.get_comm_counts().items()})
        record["scales"].append(scaler.get_scale())
        record["skips"].append(bool(torch.equal(before, local_flat(model))))
        record["norms"].append(norm_record(norm))
        record["losses"].append(loss_value.item())
        record["params"].append(local_flat(model).tolist())
    record["all_reduces"] = agreement.all_reduces if agreement else None
    return record


def main():
    rank, world, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    scenarios = sys.argv[4].split(",")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    out = {name: {impl: train(impl, name, rank, world) for impl in ("torch", "lucid")}
           for name in scenarios}
    print(json.dumps(out))
    # Every rank is done with its collectives before any leaves.
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

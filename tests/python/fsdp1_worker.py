# SPDX-License-Identifier: BSD-3-Clause
"""One rank of test_sharded_grad_scaler.py: trains a small FSDP1 (FullyShardedDataParallel)
model on the CPU in a Gloo group, once under PyTorch's ShardedGradScaler and once under
lucid_amp.ShardedGradScaler, from the same weights on the same data, for each scenario,
and prints per scenario and scaler what happened at each step as JSON (last line).

Every scenario puts an inf into rank 1's shard only (step 2) and a NaN into one element of
rank 0's shard (step 5), so a scaler that does not agree over the group lets the ranks'
decisions and weights drift apart."""

import json
import math
import pickle
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchShardedGradScaler

import lucid_amp

STEPS = 8
INF_STEP, INF_RANK = 2, 1
NAN_STEP, NAN_RANK = 5, 0
RESUME_AT = 4

# name: (sharding strategy, use_orig_params, mixed precision, clipping, optimizer, resume)
SCENARIOS = {
    "full_shard": (ShardingStrategy.FULL_SHARD, False, False, None, "sgd", False),
    "shard_grad_op_orig_params": (ShardingStrategy.SHARD_GRAD_OP, True, False, None, "adam", False),
    "mixed_precision": (ShardingStrategy.FULL_SHARD, False, True, None, "sgd", False),
    "fsdp_clip": (ShardingStrategy.FULL_SHARD, True, False, "fsdp", "sgd", False),
    "scaler_clip": (ShardingStrategy.FULL_SHARD, False, False, "scaler", "adam", False),
    "resume": (ShardingStrategy.FULL_SHARD, False, False, None, "adam", True),
}


def build(strategy, orig_params, mixed, optimizer):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
        torch.nn.Linear(16, 3))
    mp = MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16) if mixed else None
    model = FSDP(model, device_id=torch.device("cpu"), sharding_strategy=strategy,
                 use_orig_params=orig_params, mixed_precision=mp)
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, opt


def local_flat(model):
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def train(scaler_cls, scenario, rank, world):
    strategy, orig_params, mixed, clip, optimizer, resume = SCENARIOS[scenario]
    model, opt = build(strategy, orig_params, mixed, optimizer)
    scaler = scaler_cls("cpu", init_scale=2.0**10, growth_interval=3)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    record = {"scales": [], "skips": [], "norms": [], "losses": [], "params": []}
    for step in range(STEPS):
        if resume and step == RESUME_AT:
            # The scaler's state (pickled, as torch.save does) moves into a new scaler.
            state = pickle.loads(pickle.dumps(scaler.state_dict()))
            scaler = scaler_cls("cpu", init_scale=1.0, growth_interval=3)
            scaler.load_state_dict(state)
        opt.zero_grad(set_to_none=True)
        x = torch.randn(4, 6, generator=data)
        y = torch.randn(4, 3, generator=data)
        out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        scaler.scale(loss).backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None and p.grad.numel()]
        if step == INF_STEP and rank == INF_RANK:
            grads[-1].view(-1)[0] = math.inf
        if step == NAN_STEP and rank == NAN_RANK:
            grads[0].view(-1)[-1] = math.nan
        before = local_flat(model)
        norm = None
        if clip == "fsdp":
            scaler.unscale_(opt)
            norm = model.clip_grad_norm_(1.0)
        elif clip == "scaler":
            if isinstance(scaler, lucid_amp.GradScaler):
                norm = scaler.clip_grad_norm_(opt, 1.0)
            else:
                scaler.unscale_(opt)
                norm = model.clip_grad_norm_(1.0)
        scaler.step(opt)
        scaler.update()
        record["scales"].append(scaler.get_scale())
        record["skips"].append(bool(torch.equal(before, local_flat(model))))
        record["norms"].append(None if norm is None else float(norm))
        record["losses"].append(float(loss))
        record["params"].append(local_flat(model).tolist())
    return record


def main():
    rank, world, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    scenarios = sys.argv[4].split(",")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        out = {name: {"torch": train(TorchShardedGradScaler, name, rank, world),
                      "lucid": train(lucid_amp.ShardedGradScaler, name, rank, world)}
               for name in scenarios}
    finally:
        dist.destroy_process_group()
    print(json.dumps(out))


if __name__ == "__main__":
    main()

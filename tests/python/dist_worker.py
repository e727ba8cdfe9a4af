# SPDX-License-Identifier: BSD-3-Clause
"""One rank of test_distributed.py: trains a small model under lucid_amp.GradScaler in a
Gloo group over a FileStore, with an inf put into rank 1's gradients only at step 3, and
prints the scales, skip decisions and a parameter checksum as JSON."""

import json
import os
import math
import sys

import torch
import torch.distributed as dist

import lucid_amp
import lucid_amp.distributed


def sharded(rank, world):
    """Each rank owns every world-th parameter (its optimizer steps only those) and clips
    with scaler.clip_grad_norm_ under bind_to_group(sharded=True); the owners broadcast
    their parameters after each step. With world 1 this is the single-process control.
    An inf goes into the last parameter's gradient (rank 1's shard with 2 ranks) at step 3."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    params = list(model.parameters())
    mine = params[rank::world]
    opt = torch.optim.SGD(mine, lr=0.1, momentum=0.9)
    scaler = lucid_amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3)
    agreement = lucid_amp.distributed.bind_to_group(scaler, sharded=True)
    g = torch.Generator().manual_seed(1)
    norms, skips = [], []
    for step in range(8):
        opt.zero_grad()
        for p in params:
            p.grad = None
        x, y = torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        if step == 3:
            params[-1].grad[0] = math.inf
        for i, p in enumerate(params):  # a rank holds only the gradients of its shard
            if i % world != rank:
                p.grad = None
        norms.append(scaler.clip_grad_norm_(opt, 0.5).item())
        scaler.step(opt)
        skips.append(scaler.step_skipped(opt))
        scaler.update()
        for i, p in enumerate(params):
            dist.broadcast(p.data, src=i % world)
    checksum = sum(p.detach().double().sum().item() for p in params)
    return {"norms": norms, "skips": skips, "scale": scaler.get_scale(), "checksum": checksum,
            "all_reduces": agreement.all_reduces}


def finish():
    """Every rank is done with its collectives before any leaves; then the process ends
    without the interpreter's teardown. A rank has twice aborted in that teardown
    ("terminate called without an active exception", not reproduced by hand, cause not
    found), after its result was printed: the result is what the test checks."""
    sys.stdout.flush()
    dist.barrier()
    os._exit(0)


def main():
    rank, world, store_file, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    bind = mode == "bind"
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=world)
    if mode == "sharded":
        print(json.dumps(sharded(rank, world)))
        finish()
        return
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = lucid_amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3)
    agreement = lucid_amp.distributed.bind_to_group(scaler) if bind else None
    g = torch.Generator().manual_seed(1)
    scales, skips = [], []
    for step in range(8):
        opt.zero_grad()
        x, y = torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        for p in model.parameters():  # data parallel: average the gradients
            dist.all_reduce(p.grad)
            p.grad /= world
        if step == 3 and rank == world - 1:  # an overflow on the last rank only
            model.weight.grad[0, 0] = math.inf
        scaler.step(opt)
        skips.append(scaler.step_skipped(opt))
        scaler.update()
        scales.append(scaler.get_scale())
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(json.dumps({"scales": scales, "skips": skips, "checksum": checksum,
                      "all_reduces": agreement.all_reduces if agreement else 0}))
    finish()


if __name__ == "__main__":
    main()

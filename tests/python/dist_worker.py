# SPDX-License-Identifier: BSD-3-Clause
"""One rank of test_distributed.py: trains a small model under lucid_amp.GradScaler in a
Gloo group over a FileStore, with an inf put into rank 1's gradients only at step 3, and
prints the scales, skip decisions and a parameter checksum as JSON."""

import json
import math
import sys

import torch
import torch.distributed as dist

import lucid_amp
import lucid_amp.distributed


def main():
    rank, world, store_file, bind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "bind"
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=world)
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
        if step == 3 and rank == 1:
            model.weight.grad[0, 0] = math.inf
        scaler.step(opt)
        skips.append(scaler.step_skipped(opt))
        scaler.update()
        scales.append(scaler.get_scale())
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(json.dumps({"scales": scales, "skips": skips, "checksum": checksum,
                      "all_reduces": agreement.all_reduces if agreement else 0}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

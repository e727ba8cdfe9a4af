# SPDX-License-Identifier: BSD-3-Clause
"""The reference API's second example in Python: clipping the unscaled gradients. step()
sees that unscale_ already ran for the optimizer and does not divide a second time.

    python3 examples/python/clip_loop.py             # CUDA when available, else the CPU
    python3 examples/python/clip_loop.py --device cpu --steps 5
"""

import argparse

import torch

from lucid_amp import GradScaler, autocast


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--max-norm", type=float, default=1.0)
    args = parser.parse_args()
    device = torch.device(args.device)
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.MSELoss()
    dataloader = [(torch.randn(8, 4, device=device), torch.randn(8, 1, device=device))
                  for _ in range(args.steps)]

    scaler = GradScaler(device.type)
    print(f"device {device}, autocast dtype {amp_dtype}")
    for i, (x, y) in enumerate(dataloader):
        optimizer.zero_grad()
        with autocast(device.type, dtype=amp_dtype):
            out = model(x)
        loss = loss_fn(out.float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # the gradients are now the true ones
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=args.max_norm)
        scaler.step(optimizer)  # does not divide again
        scaler.update()
        state = "skipped" if scaler.step_skipped(optimizer) else "stepped"
        print(f"step {i}  loss {loss.item():.6f}  scale {scaler.get_scale():.1f}  {state}  "
              f"grad norm before clipping {norm.item():.6f}")


if __name__ == "__main__":
    main()

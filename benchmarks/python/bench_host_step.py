# SPDX-License-Identifier: BSD-3-Clause
"""The host time of one optimizer step, where the kernels' own work is negligible.

N one-element float32 parameters (144 by default, the tensor count of bench_loops.py's
116M model) on one device: the time of one call of
  * lucid_amp.optim.FusedAdamW.step() and its kernel entry alone (_FusedGroup.prepare_,
    which takes and checks every tensor, and adam_, which launches),
  * lucid_amp.GradScaler step + update with that optimizer, and clip_grad_norm_ + step +
    update (bench_loops.py's clipped loop),
  * torch.optim.AdamW(foreach=True).step() beside them, and where the installed PyTorch
    has fused=True for the device, that step alone and with torch.amp.GradScaler's step +
    update,
as the best of 5 runs of `iters` back-to-back calls (per call, in microseconds). On a GPU
the calls are asynchronous and this is the time the host spends enqueueing them; on the
CPU it includes the kernels, which for one-element tensors cost little. With --sync each
call is followed by a device synchronisation: on a GPU, the time of one whole step,
host and kernels, which for one-element tensors is the kernels' latency.

Usage: python3 bench_host_step.py [--device cpu|cuda] [--tensors N] [--iters K] [--sync]
"""
import argparse
import time

import torch

import lucid_amp
from lucid_amp.optim import FusedAdamW


def per_call_us(fn, iters, device, sync):
    def wait():
        if device == "cuda":
            torch.cuda.synchronize()

    def call():
        fn()
        if sync:
            wait()

    for _ in range(max(iters // 10, 10)):
        call()
    best = float("inf")
    for _ in range(5):
        wait()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        wait()
        best = min(best, (time.perf_counter() - start) / iters * 1e6)
    return best


def make_params(n, device):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(1, generator=gen).to(device)) for _ in range(n)]
    for p in params:
        p.grad = torch.randn(1, generator=gen).to(device)
    return params


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--tensors", type=int, default=144)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--sync", action="store_true", help="synchronise after every call")
    args = parser.parse_args()
    dev, n, iters = args.device, args.tensors, args.iters
    print(f"torch {torch.__version__}, device {dev}, {n} one-element parameters, "
          f"best of 5 runs of {iters} calls" + (", each synchronised" if args.sync else ""))

    params = make_params(n, dev)
    opt = FusedAdamW(params, lr=1e-3)
    opt.step()  # builds and keeps the group's lists
    group = opt.param_groups[0]
    fused = opt._lucid_groups[0][2]
    hyper = (1e-3, 0.9, 0.999, 1e-8, 1e-2, False, True, None, None)

    def kernel_entry():
        fused.prepare_(group["params"])
        fused.adam_(*hyper)

    rows = [
        ("lucid_amp FusedAdamW: kernel entry (prepare_ + adam_)", kernel_entry),
        ("lucid_amp FusedAdamW: step()", opt.step),
    ]
    scaler = lucid_amp.GradScaler(dev, init_scale=1.0)
    scaler.scale(torch.ones((), device=dev))  # makes the scale, as a training loop's first scale()

    def scaler_step_update():
        scaler.step(opt)
        scaler.update()

    def scaler_clip_step_update():
        scaler.clip_grad_norm_(opt, 1.0)
        scaler.step(opt)
        scaler.update()

    rows.append(("lucid_amp.GradScaler step + update, FusedAdamW", scaler_step_update))
    rows.append(("lucid_amp.GradScaler clip_grad_norm_ + step + update", scaler_clip_step_update))
    for kind in ("foreach", "fused"):
        try:
            ref = torch.optim.AdamW(make_params(n, dev), lr=1e-3, **{kind: True})
            ref.step()
        except (TypeError, RuntimeError, ValueError) as err:
            print(f"  torch.optim.AdamW({kind}=True): not available here ({err})")
            continue
        rows.append((f"torch.optim.AdamW({kind}=True): step()", ref.step))
        if kind == "fused":
            torch_scaler = torch.amp.GradScaler(dev, init_scale=1.0)
            torch_scaler.scale(torch.ones((), device=dev))

            def torch_step_update(ref=ref, torch_scaler=torch_scaler):
                torch_scaler.step(ref)
                torch_scaler.update()

            rows.append(("torch.amp.GradScaler step + update, AdamW(fused=True)",
                         torch_step_update))
    for name, fn in rows:
        print(f"  {name:<55} {per_call_us(fn, iters, dev, args.sync):8.2f} us per call")


if __name__ == "__main__":
    main()

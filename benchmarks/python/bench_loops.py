# SPDX-License-Identifier: BSD-3-Clause
"""PyTorch's Python training loops and lucid_amp's, timed in the same process on one GPU.

For the transformer-like parameter lists of bench_scaler_step (116M in 144 tensors, 1.29B
in 288), the median of 20 iterations after 5 warm-ups, CUDA events around one iteration:
  * the bare fused AdamW step (torch.optim.AdamW(fused=True), lucid_amp.optim.FusedAdamW);
  * scaler.step + scaler.update over it, with torch.amp.GradScaler and lucid_amp.GradScaler;
  * the clipped loop: unscale_ + torch.nn.utils.clip_grad_norm_ (foreach) + step + update,
    and lucid_amp's scaler.clip_grad_norm_ + step + update.
Ratios are to the bare step of the same optimizer. Usage: python3 bench_loops.py
[MILLIONS LAYERS ...] (default: 125 12 1300 24, as bench_scaler_step).
"""
import sys

import torch

DEV = "cuda"


def bench(fn, iters=20, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def make_params(total, layers):
    d = int((total / (12 * layers)) ** 0.5) // 64 * 64
    shapes = []
    for _ in range(layers):
        shapes += [(3 * d, d), (3 * d,), (d, d), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,),
                   (d,), (d,), (d,), (d,)]
    params = [torch.nn.Parameter(torch.randn(s, device=DEV) * 0.02) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e3
    return params


def clipped_loop(scaler, opt, params):
    """One iteration of the clipped loop: lucid_amp's clip_grad_norm_ where the scaler has
    it, else unscale_ and torch.nn.utils.clip_grad_norm_ (foreach); then step, update."""
    if hasattr(scaler, "clip_grad_norm_"):
        def clipped():
            scaler.clip_grad_norm_(opt, 1.0)
            scaler.step(opt)
            scaler.update()
    else:
        def clipped():
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
            scaler.step(opt)
            scaler.update()
    return clipped


def loops(name, make_optimizer, make_scaler, params, clip=True):
    opt = make_optimizer(params)
    bare = bench(opt.step)
    scaler = make_scaler()
    scaler.scale(torch.ones((), device=DEV))

    def step_update():
        scaler.step(opt)
        scaler.update()

    scaled = bench(step_update)
    line = f"  {name:44s} bare {bare:8.3f} ms | step+update {scaled:8.3f} ms ({scaled / bare:.3f}x)"
    if clip:
        ms = bench(clipped_loop(scaler, opt, params))
        line += f" | clipped loop {ms:8.3f} ms ({ms / bare:.3f}x)"
    print(line, flush=True)


def main():
    print("torch", torch.__version__, torch.cuda.get_device_name(), flush=True)
    try:
        import lucid_amp
        import lucid_amp.optim
    except ImportError as e:
        lucid_amp = None
        print("lucid_amp not importable:", e, flush=True)
    torch.manual_seed(0)
    # Sizes as bench_scaler_step takes them: millions of parameters and layers, in pairs.
    args = [int(a) for a in sys.argv[1:]]
    sizes = [(m * 1_000_000, n) for m, n in zip(args[::2], args[1::2])]
    for total, layers in sizes or [(125_000_000, 12), (1_300_000_000, 24)]:
        params = make_params(total, layers)
        count = sum(p.numel() for p in params)
        print(f"\n{count} parameters in {len(params)} tensors", flush=True)
        fused_adamw = lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True)
        loops("torch.amp.GradScaler, torch fused AdamW", fused_adamw,
              lambda: torch.amp.GradScaler("cuda", init_scale=1.0), params)
        if lucid_amp is not None:
            loops("lucid_amp.GradScaler, torch fused AdamW", fused_adamw,
                  lambda: lucid_amp.GradScaler("cuda", init_scale=1.0), params)
            loops("lucid_amp.GradScaler, lucid_amp FusedAdamW",
                  lambda ps: lucid_amp.optim.FusedAdamW(ps, lr=1e-3),
                  lambda: lucid_amp.GradScaler("cuda", init_scale=1.0), params)
        del params
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())

# SPDX-License-Identifier: BSD-3-Clause
"""Where the time of bench_loops.py's Python loops goes, on one GPU: for each loop, the
median CUDA-event time of one iteration (as bench_loops.py), the median host time of the
call (perf_counter, no synchronisation: a host time near the event time means the loop is
bound by the host), and the GPU kernels of 5 profiled iterations (torch.profiler) with
their time per iteration. With --detail also one iteration's timeline (host ranges and
CUDA calls beside the GPU's kernels) and the host's cProfile per call.
Usage: python3 profile_loops.py [--detail] [total_parameters layers]
"""
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_loops import DEV, bench, clipped_loop, make_params  # noqa: E402


def host_median(fn, iters=20):
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(times)


def kernels(fn, iters=5):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        cuda_us = getattr(e, "self_device_time_total", None)
        if cuda_us is None:
            cuda_us = e.self_cuda_time_total
        if cuda_us > 0:
            rows.append((cuda_us / iters, e.count / iters, e.key))
    rows.sort(reverse=True)
    return rows


def timeline(fn):
    """One profiled iteration (after warm-up): the host's marked ranges and CUDA runtime
    calls and the GPU's kernels and copies, in start order, in microseconds from the
    first of them."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    keep = ("lucid.", "Optimizer.step", "cudaLaunchKernel", "cudaMemcpy", "Synchronize",
            "cudaStreamWait", "cuLaunchKernel")
    rows = []
    for e in prof.events():
        gpu = str(e.device_type).endswith("CUDA")
        if gpu or any(k in e.name for k in keep):
            rows.append((e.time_range.start, e.time_range.end, "GPU " if gpu else "host", e.name))
    if not rows:
        return
    t0 = min(r[0] for r in rows)
    for start, end, where, name in sorted(rows):
        print(f"      {where} {start - t0:9.1f} .. {end - t0:9.1f}  {name[:80]}", flush=True)


def host_profile(fn, iters=30):
    """Host time per call of the Python functions and C++ entry points (cProfile)."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:10]
    for (path, line, func), (_, calls, tottime, cumtime, _) in rows:
        print(f"      host {tottime / iters * 1e6:8.1f} us self {cumtime / iters * 1e6:8.1f} us total"
              f"  x{calls / iters:5.1f}  {path.rsplit('/', 1)[-1]}:{line}({func})", flush=True)


def report(name, fn):
    ev = bench(fn)
    host = host_median(fn)
    print(f"\n{name}: event {ev:.3f} ms, host {host:.3f} ms", flush=True)
    total = 0.0
    for us, count, key in kernels(fn)[:8]:
        total += us
        print(f"    {us / 1e3:8.3f} ms  x{count:5.1f}  {key[:90]}", flush=True)
    print(f"    {total / 1e3:8.3f} ms  in the kernels listed", flush=True)
    if DETAIL:
        timeline(fn)
        host_profile(fn)


DETAIL = "--detail" in sys.argv


def main():
    import lucid_amp
    if DETAIL:
        sys.argv.remove("--detail")
    import lucid_amp.optim

    total, layers = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (125_000_000, 12)
    print("torch", torch.__version__, torch.cuda.get_device_name(), flush=True)
    torch.manual_seed(0)
    params = make_params(total, layers)
    print(f"{sum(p.numel() for p in params)} parameters in {len(params)} tensors", flush=True)
    for label, make_opt in [
        ("torch fused AdamW", lambda: torch.optim.AdamW(params, lr=1e-3, fused=True)),
        ("lucid_amp FusedAdamW", lambda: lucid_amp.optim.FusedAdamW(params, lr=1e-3)),
    ]:
        opt = make_opt()
        report(f"{label}: bare step", opt.step)
        for scaler_name, make_scaler in [
            ("torch.amp.GradScaler", lambda: torch.amp.GradScaler("cuda", init_scale=1.0)),
            ("lucid_amp.GradScaler", lambda: lucid_amp.GradScaler("cuda", init_scale=1.0)),
        ]:
            scaler = make_scaler()
            scaler.scale(torch.ones((), device=DEV))

            def step_update():
                with torch.profiler.record_function("lucid.mark scaler.step"):
                    scaler.step(opt)
                with torch.profiler.record_function("lucid.mark scaler.update"):
                    scaler.update()

            report(f"{label}, {scaler_name}: step+update", step_update)
            report(f"{label}, {scaler_name}: clipped loop", clipped_loop(scaler, opt, params))
    return 0


if __name__ == "__main__":
    sys.exit(main())

// SPDX-License-Identifier: BSD-3-Clause
// The scaler's GPU figures, side by side with PyTorch's own kernels in the same run:
//  * unscale-and-check: lucid-amp's kernel vs ATen's _amp_foreach_non_finite_check_and_unscale_,
//    both against a device copy of the same bytes (8 bytes per float32 gradient);
//  * read-only check (4 bytes per gradient);
//  * scaler step+update over the bare fused step, default mode and graph_safe mode;
//  * the clipped loop over the bare step of FusedAdamW, torch::optim::AdamW and
//    torch::optim::SGD; again with the two loops' iterations alternating, by CUDA events
//    and by the host's clock in the same iterations,
//    with the host time of each call (where a host-bound step's loop spends its time)
//    and, for torch::optim's optimizers, the bare step's kernels alone replayed from a
//    CUDA graph (how busy the step keeps the device);
//  * bare FusedAdamW vs torch::optim::AdamW from C++ (at the smaller size);
//  * host synchronisations per step in graph_safe mode, with CUDA's sync debug mode set
//    to error (any synchronisation would throw).
// The parameter shapes are those of the team's PyTorch baseline script (carried to the
// GPU machine as .vendor/anchors/torch_scaler_baseline.py). Run it in the same call to
// compare with PyTorch's fused optimizers (scripts/gpu_check.sh does).
//
// Usage: bench_scaler_step [million_params layers]...   (default: 125 12 1300 24)

#include <lucid/amp.h>
#include <torch/torch.h>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "amp/kernel_routing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace {

double median_ms(const std::function<void()>& fn, int iters = 20, int warm = 5) {
  for (int i = 0; i < warm; ++i) fn();
  torch::cuda::synchronize();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    start.record();
    fn();
    stop.record();
    stop.synchronize();
    times.push_back(start.elapsed_time(stop));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// One timed iteration of `fn` from an idle device: {CUDA-event time, wall time (the host's
// clock to the end of the call's last kernel)} in ms.
std::pair<double, double> event_and_wall_once(const std::function<void()>& fn) {
  torch::cuda::synchronize();
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  const auto t0 = std::chrono::steady_clock::now();
  start.record();
  fn();
  stop.record();
  stop.synchronize();
  const double wall =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return {start.elapsed_time(stop), wall};
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Event and wall-time medians of `a` and of `b`, their iterations alternating: a host
// whose speed drifts during the run (a host-bound step shows it) moves both alike, so
// their ratio holds where two separate runs would disagree.
struct AlternatingMedians {
  std::pair<double, double> a, b;  // {events, wall}
};
AlternatingMedians alternating_event_and_wall_ms(const std::function<void()>& a,
                                                 const std::function<void()>& b, int iters = 20) {
  for (int i = 0; i < 5; ++i) {
    a();
    b();
  }
  std::vector<double> a_events, a_wall, b_events, b_wall;
  for (int i = 0; i < iters; ++i) {
    const auto ta = event_and_wall_once(a);
    const auto tb = event_and_wall_once(b);
    a_events.push_back(ta.first);
    a_wall.push_back(ta.second);
    b_events.push_back(tb.first);
    b_wall.push_back(tb.second);
  }
  return {{median_of(a_events), median_of(a_wall)}, {median_of(b_events), median_of(b_wall)}};
}

// Medians of two consecutive parts, timed with three events per call.
std::pair<double, double> median_ms_parts(const std::function<void()>& first,
                                          const std::function<void()>& second, int iters = 20) {
  for (int i = 0; i < 5; ++i) {
    first();
    second();
  }
  torch::cuda::synchronize();
  std::vector<double> a, b;
  for (int i = 0; i < iters; ++i) {
    at::cuda::CUDAEvent start(cudaEventDefault), mid(cudaEventDefault), stop(cudaEventDefault);
    start.record();
    first();
    mid.record();
    second();
    stop.record();
    stop.synchronize();
    a.push_back(start.elapsed_time(mid));
    b.push_back(mid.elapsed_time(stop));
  }
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return {a[a.size() / 2], b[b.size() / 2]};
}

// Per call: `n` calls back to back between two events (host gaps hidden while the
// device is busy), median of 5.
double back_to_back_ms(const std::function<void()>& fn, int n = 20) {
  return median_ms([&] {
    for (int i = 0; i < n; ++i) fn();
  }, 5, 1) / n;
}

// Host time of one call that does not wait for the device, the device idle before it.
double host_us(const std::function<void()>& fn, int iters = 50) {
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    torch::cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  torch::cuda::synchronize();
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Transformer-like parameters, as the anchor script makes them.
std::vector<torch::Tensor> make_params(int64_t total, int layers) {
  const int64_t d = static_cast<int64_t>(std::sqrt(static_cast<double>(total) / (12.0 * layers))) / 64 * 64;
  std::vector<std::vector<int64_t>> shapes;
  for (int l = 0; l < layers; ++l) {
    const std::vector<std::vector<int64_t>> layer = {{3 * d, d}, {3 * d}, {d, d}, {d}, {4 * d, d}, {4 * d},
                                                     {d, 4 * d}, {d}, {d}, {d}, {d}, {d}};
    shapes.insert(shapes.end(), layer.begin(), layer.end());
  }
  std::vector<torch::Tensor> ps;
  for (const auto& s : shapes) {
    auto p = (torch::randn(s, torch::kCUDA) * 0.02).requires_grad_(true);
    p.mutable_grad() = torch::randn(s, torch::kCUDA) * 1e3;
    ps.push_back(p);
  }
  return ps;
}

struct SyncsAreErrors {
  SyncsAreErrors() { c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR); }
  ~SyncsAreErrors() { c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED); }
};

void optimizer_rows(const char* name, torch::optim::Optimizer& opt) {
  const double bare = median_ms([&] { opt.step(); });
  lucid::amp::GradScaler scaler(lucid::amp::GradScalerOptions().init_scale(1.0));
  scaler.scale(torch::ones({}, torch::kCUDA));
  const double scaled = median_ms([&] { scaler.step(opt); scaler.update(); });
  lucid::amp::GradScaler safe(lucid::amp::GradScalerOptions().init_scale(1.0).graph_safe(true));
  safe.scale(torch::ones({}, torch::kCUDA));
  const double graph_safe = median_ms([&] { safe.step(opt); safe.update(); });
  int syncs_graph_safe = 0;
  try {
    SyncsAreErrors no_syncs;
    safe.step(opt);
    safe.update();
  } catch (const c10::Error&) {
    syncs_graph_safe = -1;  // at least one
  }
  std::printf("  %-22s bare %8.3f ms | scaler step+update %8.3f ms (%.3fx) | graph_safe %8.3f ms (%.3fx), host syncs %s\n",
              name, bare, scaled, scaled / bare, graph_safe, graph_safe / bare,
              syncs_graph_safe == 0 ? "0" : ">=1");
  // Where a default-mode iteration's time goes: step (check, fused step, flag read) and
  // update (launched after that read, with the device idle).
  const auto [step_ms, update_ms] = median_ms_parts([&] { scaler.step(opt); }, [&] { scaler.update(); });
  std::printf("  %-22s default mode: step %8.3f ms + update %6.3f ms; host enqueue of bare step %6.1f us, "
              "graph_safe step+update %6.1f us\n",
              "", step_ms, update_ms, host_us([&] { opt.step(); }),
              host_us([&] { safe.step(opt); safe.update(); }));
}

// The median host time of each part of fn's iterations in microseconds, the device idle
// at the start of each: parts[i] runs from mark i to mark i + 1 (fn calls mark()).
std::vector<double> host_parts_us(const std::function<void(const std::function<void()>&)>& fn,
                                  int iters = 20) {
  std::vector<std::vector<double>> parts;
  for (int i = 0; i < iters + 3; ++i) {
    torch::cuda::synchronize();
    std::vector<std::chrono::steady_clock::time_point> marks{std::chrono::steady_clock::now()};
    fn([&] { marks.push_back(std::chrono::steady_clock::now()); });
    if (i < 3) continue;  // warm-up
    parts.resize(marks.size() - 1);
    for (size_t k = 0; k + 1 < marks.size(); ++k) {
      parts[k].push_back(std::chrono::duration<double, std::micro>(marks[k + 1] - marks[k]).count());
    }
  }
  torch::cuda::synchronize();
  std::vector<double> medians;
  for (auto& p : parts) {
    std::sort(p.begin(), p.end());
    medians.push_back(p[p.size() / 2]);
  }
  return medians;
}

// The device time of fn's kernels alone: fn captured once into a CUDA graph and the graph
// replayed, so no host launch time is in it. Negative when fn cannot be captured (the
// capture is then ended, so that the stream can be used again).
double graph_replay_ms(const std::function<void()>& fn) {
  torch::cuda::synchronize();
  auto side = c10::cuda::getStreamFromPool();
  try {
    at::cuda::CUDAGraph graph;
    {
      c10::cuda::CUDAStreamGuard guard(side);
      fn();  // once on the capture stream first, as PyTorch's graph capture asks
      side.synchronize();
      graph.capture_begin();
      fn();
      graph.capture_end();
    }
    torch::cuda::synchronize();
    return median_ms([&] { graph.replay(); });
  } catch (const std::exception& e) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(side.stream(), &status) == cudaSuccess &&
        status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      cudaStreamEndCapture(side.stream(), &partial);
      if (partial != nullptr) cudaGraphDestroy(partial);
    }
    (void)cudaGetLastError();
    std::printf("  (graph capture failed: %s)\n", e.what());
    return -1.0;
  }
}

// The reference loop with clipping: unscale_ + clip + step + update, as
// scaler.clip_grad_norm_ (one read pass; folded into a fused optimizer's step) and as
// unscale_ + torch::nn::utils::clip_grad_norm_ (the C++ frontend's clip), each over the
// bare step of the same optimizer.
void clip_rows(const char* name, torch::optim::Optimizer& opt, std::vector<torch::Tensor>& params,
               bool replay_bare = false) {
  const double bare = median_ms([&] { opt.step(); });
  lucid::amp::GradScaler scaler(lucid::amp::GradScalerOptions().init_scale(1.0));
  scaler.scale(torch::ones({}, torch::kCUDA));
  const double fused = median_ms([&] {
    scaler.clip_grad_norm_(opt, 1.0);
    scaler.step(opt);
    scaler.update();
  });
  const double control = median_ms([&] {
    scaler.unscale_(opt);
    torch::nn::utils::clip_grad_norm_(params, 1.0);
    scaler.step(opt);
    scaler.update();
  }, 10, 2);
  std::printf("  %-22s bare %8.3f ms | clip_grad_norm_+step+update %8.3f ms (%.3fx) | unscale_+"
              "torch clip+step+update %8.3f ms (%.3fx)\n",
              name, bare, fused, fused / bare, control, control / bare);
  // The same two loops again, their iterations alternating, timed from an idle device to
  // the end of their last kernel on the host's clock beside the events of the same
  // iterations: where the host's enqueue is longer than the device's work, the clock is
  // the time an iteration takes.
  const auto clipped_loop = [&] {
    scaler.clip_grad_norm_(opt, 1.0);
    scaler.step(opt);
    scaler.update();
  };
  const AlternatingMedians both = alternating_event_and_wall_ms([&] { opt.step(); }, clipped_loop);
  const auto& bare_both = both.a;
  const auto& fused_both = both.b;
  std::printf("  %-22s alternating: events %8.3f / %8.3f ms (%.3fx) | wall clock %8.3f / %8.3f"
              " ms (%.3fx) (bare / clip_grad_norm_+step+update)\n",
              "", bare_both.first, fused_both.first, fused_both.first / bare_both.first,
              bare_both.second, fused_both.second, fused_both.second / bare_both.second);
  // How busy the bare step keeps the device: a step whose kernels take about its whole
  // event time is device-bound, and every pass queued before it adds to the loop.
  const double device_only = replay_bare ? graph_replay_ms([&] { opt.step(); }) : -1.0;
  if (device_only > 0.0) {
    std::printf("  %-22s bare step's kernels alone (CUDA graph replay) %8.3f ms: %.0f%% of "
                "its event time\n",
                "", device_only, 100.0 * device_only / bare_both.first);
  }
  // Where a host-bound step's loop spends its time: step() waits for the flag first.
  const double bare_host = host_parts_us([&](const auto& mark) {
    opt.step();
    mark();
  })[0];
  const std::vector<double> loop = host_parts_us([&](const auto& mark) {
    scaler.clip_grad_norm_(opt, 1.0);
    mark();
    scaler.step(opt);
    mark();
    scaler.update();
    mark();
  });
  std::printf("  %-22s host: bare step %7.1f us | clip_grad_norm_ %6.1f us, step %7.1f us, "
              "update %6.1f us\n",
              "", bare_host, loop[0], loop[1], loop[2]);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::vector<std::pair<int64_t, int>> sizes;
  for (int i = 1; i + 1 < argc; i += 2) sizes.push_back({std::stoll(argv[i]), std::stoi(argv[i + 1])});
  if (sizes.empty()) sizes = {{125, 12}, {1300, 24}};
  torch::manual_seed(0);
  {
    const int64_t n = int64_t{1} << 30;
    auto a = torch::randn({n}, torch::kCUDA), b = torch::empty_like(a);
    const double ms = median_ms([&] { b.copy_(a); });
    std::printf("device copy: %.1f GB/s\n", 8.0 * n / ms / 1e6);
  }
  for (const auto& [millions, layers] : sizes) {
    auto params = make_params(millions * 1000 * 1000, layers);
    std::vector<torch::Tensor> grads;
    int64_t P = 0;
    for (auto& p : params) {
      grads.push_back(p.grad());
      P += p.numel();
    }
    std::printf("\n%ld parameters in %zu tensors\n", static_cast<long>(P), params.size());
    auto copy_src = torch::randn({P}, torch::kCUDA), copy_dst = torch::empty_like(copy_src);
    const double copy_ms = median_ms([&] { copy_dst.copy_(copy_src); });
    auto found = torch::zeros({}, torch::kCUDA);
    auto one = torch::ones({}, torch::kCUDA);
    const double ours = median_ms([&] { lucid::amp::detail::unscale_grads_(grads, one, found); });
    const double aten = median_ms([&] { at::_amp_foreach_non_finite_check_and_unscale_(grads, found, one); });
    const double check = median_ms([&] { lucid::amp::detail::check_grads_finite_(grads, one, found); });
    const double ours_kernel = back_to_back_ms([&] { lucid::amp::detail::unscale_grads_(grads, one, found); });
    const double copy_kernel = back_to_back_ms([&] { copy_dst.copy_(copy_src); });
    const double ours_host = host_us([&] { lucid::amp::detail::unscale_grads_(grads, one, found); });
    const double gb = 8.0 * P / 1e6;
    std::printf("  copy (same bytes)      %8.3f ms  %7.1f GB/s\n", copy_ms, gb / copy_ms);
    std::printf("  unscale lucid-amp      %8.3f ms  %7.1f GB/s  %.3f x copy\n", ours, gb / ours, copy_ms / ours);
    std::printf("  unscale lucid-amp, 20 back to back: %.3f ms per call, copy %.3f ms: %.3f x copy; host "
                "enqueue %.1f us per call\n", ours_kernel, copy_kernel, copy_kernel / ours_kernel, ours_host);
    // Floors for the host enqueue above: one ATen kernel launch, and the copy's own call.
    std::printf("  host enqueue floors: found.zero_() %.1f us, copy_ %.1f us\n",
                host_us([&] { found.zero_(); }), host_us([&] { copy_dst.copy_(copy_src); }));
    std::printf("  unscale ATen (PyTorch) %8.3f ms  %7.1f GB/s  %.3f x copy\n", aten, gb / aten, copy_ms / aten);
    std::printf("  read-only check        %8.3f ms  %7.1f GB/s (4 B/elt)  %.3f of a copy's time\n", check,
                gb / 2 / check, check / copy_ms);
    {
      lucid::optim::FusedAdamW adamw(params, lucid::optim::FusedAdamWOptions(1e-3));
      optimizer_rows("FusedAdamW", adamw);
    }
    {
      lucid::optim::FusedSGD sgd(params, lucid::optim::FusedSGDOptions(1e-3).momentum(0.9));
      optimizer_rows("FusedSGD momentum", sgd);
    }
    {
      lucid::optim::FusedAdamW adamw(params, lucid::optim::FusedAdamWOptions(1e-3));
      clip_rows("clip, FusedAdamW", adamw, params);
    }
    if (P < 300 * 1000 * 1000) {
      torch::optim::AdamW adamw(params, torch::optim::AdamWOptions(1e-3));
      clip_rows("clip, torch AdamW", adamw, params, /*replay_bare=*/true);
      torch::optim::SGD sgd(params, torch::optim::SGDOptions(1e-3));
      clip_rows("clip, torch SGD", sgd, params, /*replay_bare=*/true);
      const double free_clip = median_ms([&] { lucid::amp::clip_grad_norm_(params, 1.0); });
      const double torch_clip =
          median_ms([&] { torch::nn::utils::clip_grad_norm_(params, 1.0); }, 10, 2);
      std::printf("  clip_grad_norm_: lucid::amp %8.3f ms vs torch::nn::utils %8.3f ms: %.1fx faster\n",
                  free_clip, torch_clip, torch_clip / free_clip);
    }
    if (P < 300 * 1000 * 1000) {
      torch::optim::AdamW reference(params, torch::optim::AdamWOptions(1e-3));
      const double ms = median_ms([&] { reference.step(); }, 10, 2);
      lucid::optim::FusedAdamW adamw(params, lucid::optim::FusedAdamWOptions(1e-3));
      const double fused = median_ms([&] { adamw.step(); });
      std::printf("  torch::optim::AdamW (C++) %8.3f ms vs FusedAdamW %8.3f ms: %.1fx faster\n", ms, fused, ms / fused);
    }
  }
  return 0;
}

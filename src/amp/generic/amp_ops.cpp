// SPDX-License-Identifier: BSD-3-Clause
// The generic table of the backend interface (amp/backend.h), built from ATen operations:
// runs on any LibTorch device (Apple MPS, XPU, ...), one tensor at a time, with no host
// synchronisation. It is the fallback for every device without a table of its own and
// for tensors a device table does not take (sparse values, overlapping strides).
// Unchecked on purpose: the routing (kernel_routing.cpp) owns the preconditions, stated
// with AmpBackend.

#include "amp/backend.h"
#include "amp/scale_rule.h"

#include <algorithm>
#include <cmath>

namespace lucid {
namespace amp {
namespace generic {
namespace {

// Records the unscaled values `work` of gradient i: raises `found_inf` where one is not
// finite, and there lowers the site's first key to gradient i's and adds its NaN and inf
// entries to the site's counts.
void record(const at::Tensor& work, at::Tensor& found_inf, const OverflowSite& site, size_t i) {
  const at::Tensor bad = work.isfinite().logical_not().any();
  found_inf.copy_(at::maximum(found_inf, bad.to(found_inf.device(), at::kFloat)));
  if (site.slot.defined()) {
    const at::Device where = site.slot.device();
    const at::Tensor key = at::where(bad.to(where), site.keys[i], detail::kNoOverflowKey);
    at::Tensor first = site.slot.select(0, detail::kSiteFirstKey);
    first.copy_(at::minimum(first, key));
    site.slot.narrow(0, detail::kSiteNanCount, 2)
        .add_(at::stack({work.isnan().sum(), work.isinf().sum()}).to(where));
  }
}

void unscale_and_check_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                        at::Tensor& found_inf, const OverflowSite& site) {
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& grad = grads[i];
    // float64 is unscaled in float64; float32 and bfloat16 in float32 (opmath).
    const at::ScalarType opmath =
        grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    // The reciprocal in opmath on the gradient's device: float64 only where the gradient
    // is float64 already (devices such as MPS have no float64 at all); a float32 division
    // is correctly rounded.
    const at::Tensor inv_scale = scale.to(grad.device(), opmath).reciprocal();
    at::Tensor work = grad.scalar_type() == opmath ? grad : grad.to(opmath);
    work.mul_(inv_scale);
    record(work, found_inf, site, i);
    if (!work.is_same(grad)) {
      grad.copy_(work);  // the single rounding back to the gradient's dtype
    }
  }
}

void check_finite_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                   at::Tensor& found_inf, const OverflowSite& site) {
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& grad = grads[i];
    const at::ScalarType opmath =
        grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    at::Tensor work = grad.to(opmath);
    if (scale.defined()) {
      work = work * scale.to(grad.device(), opmath).reciprocal();
    }
    record(work, found_inf, site, i);
  }
}

at::Tensor check_and_norm_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                           at::Tensor& found_inf, const OverflowSite& site, NormKind kind) {
  // Per tensor in float32 (the partial's type), then across tensors in list order.
  std::vector<at::Tensor> partials;
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& grad = grads[i];
    if (grad.numel() == 0) {
      continue;
    }
    const at::ScalarType opmath = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    at::Tensor work = grad.to(opmath);
    if (scale.defined()) {
      work = work * scale.to(grad.device(), opmath).reciprocal();
    }
    record(work, found_inf, site, i);
    const at::Tensor x = work.to(at::kFloat);
    partials.push_back(kind == NormKind::kTwo ? (x * x).sum() : x.abs().max());
  }
  const at::TensorOptions out =
      at::TensorOptions().dtype(at::kFloat).device(grads.front().device());
  if (partials.empty()) {
    return at::zeros({}, out);
  }
  const at::Tensor stacked = at::stack(partials);
  return kind == NormKind::kTwo ? stacked.sum() : stacked.max();
}

// scale * backoff_factor, never below detail::kScaleFloor (nor below a smaller scale).
at::Tensor backed_off(const at::Tensor& scale, double backoff_factor) {
  const at::Tensor floor =
      at::minimum(scale, at::full({}, detail::kScaleFloor, scale.options()));
  return at::maximum(scale * backoff_factor, floor);
}

// detail::take_found_inf, as tensor ops.
at::Tensor take_found_inf(const at::Tensor& flags) {
  constexpr int64_t kLastBit = detail::kOverflowOptimizerBits - 1;
  const at::Tensor raised = flags.reshape({-1}).ne(0).to(at::kLong);
  const int64_t n = raised.numel();
  const int64_t low = std::min(n, kLastBit);
  at::Tensor bits =
      raised.narrow(0, 0, low).mul(at::pow(2, at::arange(low, raised.options()))).sum();
  if (n > kLastBit) {
    bits.add_(raised.narrow(0, kLastBit, n - kLastBit).amax(), int64_t{1} << kLastBit);
  }
  flags.zero_();
  return bits.to(at::kFloat);
}

}  // namespace

void count_steps_(const at::Tensor& flags, const UpdateRecord& record) {
  const at::Tensor taken_skipped = record.counts.narrow(0, detail::kCountStepsTaken, 2);
  for (int64_t j = 0; j < flags.numel(); ++j) {
    if (record.stepped.has(j)) {
      const at::Tensor skipped = flags.select(0, j).ne(0);
      taken_skipped.add_(at::stack({skipped.logical_not(), skipped}));
      record.step_outcomes.select(0, j).copy_(skipped);
    }
  }
}

namespace {

void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, at::Tensor& overflow_tracker,
                   const at::Tensor& flags, const detail::ScaleRule& rule,
                   const UpdateRecord& record) {
  if (record.step_outcomes.defined()) {
    count_steps_(flags, record);
  }
  // Same decisions as detail::next_scale_state, written as selects on the device (no host
  // synchronisation). The products are float32 (no float64 on MPS): with power-of-two
  // factors, the defaults, identical to the CPU and CUDA schedule; with others they may
  // differ in the last bit.
  const at::Tensor found_inf = take_found_inf(flags);
  const at::Tensor found = found_inf.ne(0);
  const at::Tensor successful = growth_tracker + 1;
  const at::Tensor grow = found.logical_not().logical_and(successful.eq(rule.growth_interval));
  at::Tensor grown = scale * rule.growth_factor;
  grown = at::where(grown.isfinite(), grown, scale);
  if (std::isfinite(rule.max_scale)) {
    grown = at::minimum(grown, at::full({}, rule.max_scale, scale.options()));
  }
  // Hysteresis absorbs an overflow while the count of absorbed ones stays below it.
  at::Tensor backoff = found;
  at::Tensor new_overflow;
  if (overflow_tracker.defined()) {
    const at::Tensor next_overflow = overflow_tracker + 1;
    const at::Tensor absorb = found.logical_and(next_overflow.lt(rule.hysteresis));
    backoff = found.logical_and(absorb.logical_not());
    // Absorbed: one more; backed off: kept; grown: refilled; other clean updates:
    // refilled only in the consecutive mode.
    const at::Tensor refill = rule.refill_on_clean ? found.logical_not() : grow;
    new_overflow = at::where(absorb, next_overflow,
                             at::where(refill, at::zeros_like(overflow_tracker), overflow_tracker));
  }
  const at::Tensor new_scale =
      at::where(backoff, backed_off(scale, rule.backoff_factor), at::where(grow, grown, scale));
  const at::Tensor new_tracker =
      at::where(found.logical_or(grow), at::zeros_like(successful), successful);
  // detail::log_update's row, from the scale before it is written.
  at::Tensor row;
  const at::Tensor logged =
      record.log.defined() ? record.log.select(0, 0).select(0, 0) : at::Tensor();
  if (logged.defined()) {
    using detail::ScaleEvent;
    const at::Tensor absorbed = found.logical_and(backoff.logical_not());
    const at::Tensor event =
        at::where(backoff, static_cast<int>(ScaleEvent::kBackoff),
                  at::where(absorbed, static_cast<int>(ScaleEvent::kAbsorbed),
                            at::where(grow, static_cast<int>(ScaleEvent::kGrowth),
                                      static_cast<int>(ScaleEvent::kNone))));
    const at::Tensor norm =
        record.grad_norm.defined() ? record.grad_norm : at::full({}, -1.0, scale.options());
    const at::Tensor& site = record.overflow_site;
    at::Tensor site_logged;  // first key (-1: none), NaN count, inf count
    if (site.defined()) {
      const at::Tensor first = site.select(0, detail::kSiteFirstKey);
      site_logged = at::cat(
          {at::where(first.eq(detail::kNoOverflowKey), -1.0, first.to(at::kDouble)).reshape({1}),
           site.narrow(0, detail::kSiteNanCount, 2).to(at::kDouble)});
    } else {
      site_logged = at::tensor({-1.0, 0.0, 0.0}, scale.options().dtype(at::kDouble));
    }
    row = at::cat(
        {at::stack({logged, scale.to(at::kDouble), new_scale.to(at::kDouble),
                    found_inf.to(at::kDouble), event.to(at::kDouble), norm.to(at::kDouble)}),
         site_logged});
    if (site.defined()) {
      reset_overflow_site_slot(site);
    }
  }
  scale.copy_(new_scale);
  growth_tracker.copy_(new_tracker);
  if (new_overflow.defined()) {
    overflow_tracker.copy_(new_overflow);
  }
  const at::Tensor& counts = record.counts;
  if (counts.defined()) {  // detail::count_update, as selects
    counts.narrow(0, detail::kCountUpdates, 4)
        .add_(at::stack({at::ones_like(found), found, backoff, grow}));
    counts.select(0, detail::kCountOverflowStreak).add_(1).mul_(found);
  }
  if (row.defined()) {
    const at::Tensor index =
        logged.to(at::kLong).remainder(detail::kStepLogRows).add(1).reshape({1});
    record.log.index_copy_(0, index, row.unsqueeze(0));
    logged.add_(1);
  }
}

}  // namespace

const AmpBackend& amp_backend() {
  static const AmpBackend table{"generic",
                                unscale_and_check_,
                                check_finite_,
                                check_and_norm_,
                                update_scale_,
                                /*clip_factors_=*/nullptr,
                                /*start_flag_read_=*/nullptr};
  return table;
}

}  // namespace generic
}  // namespace amp
}  // namespace lucid

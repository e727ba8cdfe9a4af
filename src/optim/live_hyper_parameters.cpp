// SPDX-License-Identifier: BSD-3-Clause
// NOTE: [Hyper-parameters on the device]
// A CUDA graph replays kernels with the arguments of their capture, so a learning rate
// passed by value would stay at its capture-time value forever. The fused kernels
// therefore read the values that schedules change (LiveSlot: lr, weight decay, momentum)
// from a small float64 tensor per group and device. Two things keep it equal to the
// group's options:
// - the options' setters (and set_lr, which LR schedulers call) write it with a fill on
//   the current stream: after every replay already queued, before any queued later, as
//   an eager step would see it; no host synchronisation;
// - each eager step compares the host values with what it last wrote and writes the
//   ones that differ (an option changed through a path that bypasses the setters). A
//   step being captured writes nothing: a fill in the graph would undo, on every replay,
//   whatever the setters wrote before it.
// The tensor is made by an eager step: made inside a capture, its initial fill would
// become part of the graph and reset it on every replay.

#include <lucid/optim/fused_optimizer.h>

#include "common/device_kernels.h"
#include "optim/fused_backend.h"
#include "optim/fused_kernel_params.h"

#include <c10/util/Exception.h>

#include <array>
#include <vector>

namespace lucid {
namespace optim {
namespace detail {

class DeviceHyperCopies {
 public:
  void write(int slot, double value) {
    for (Copy& copy : copies_) {
      write_slot(copy, slot, value);
    }
  }

  const at::Tensor& on(const c10::Device& device,
                       const std::array<double, LiveSlot::kCount>& values) {
    const bool capturing = ::lucid::capturing(device);
    Copy* copy = find(device);
    if (copy == nullptr) {
      TORCH_CHECK(!capturing, "A fused optimizer's first step on ", device,
                  " is being captured in a CUDA graph: its hyper-parameters would be reset to "
                  "their capture-time values on every replay. Run at least one step before "
                  "capturing (as CUDA graphs need warm-up steps anyway).");
      at::Tensor tensor =
          at::empty({LiveSlot::kCount}, at::TensorOptions().dtype(at::kDouble).device(device));
      copies_.push_back({device, tensor, {}});
      copy = &copies_.back();
      for (int slot = 0; slot < LiveSlot::kCount; ++slot) {
        write_slot(*copy, slot, values[slot]);
      }
    }
    if (capturing) {
      return copy->values;  // a fill here would replay: the setters keep the copy current
    }
    for (int slot = 0; slot < LiveSlot::kCount; ++slot) {
      if (copy->written[slot] != values[slot]) {
        write_slot(*copy, slot, values[slot]);
      }
    }
    return copy->values;
  }

 private:
  struct Copy {
    c10::Device device;
    at::Tensor values;                             // float64, LiveSlot::kCount entries
    std::array<double, LiveSlot::kCount> written;  // what the last fills wrote
  };

  static void write_slot(Copy& copy, int slot, double value) {
    copy.values.select(0, slot).fill_(value);
    copy.written[slot] = value;
  }

  Copy* find(const c10::Device& device) {
    for (Copy& copy : copies_) {
      if (copy.device == device) {
        return &copy;
      }
    }
    return nullptr;
  }

  std::vector<Copy> copies_;
};

LiveHyperParameters::LiveHyperParameters() = default;

LiveHyperParameters::~LiveHyperParameters() = default;

LiveHyperParameters::LiveHyperParameters(const LiveHyperParameters& /*other*/) {}

LiveHyperParameters& LiveHyperParameters::operator=(const LiveHyperParameters& /*other*/) {
  return *this;
}

void LiveHyperParameters::write(int slot, double value) {
  TORCH_CHECK_INDEX(0 <= slot && slot < LiveSlot::kCount, "LiveHyperParameters: slot ", slot,
                    " is not one of 0 (lr), 1 (weight decay), 2 (momentum).");
  if (copies_) {
    copies_->write(slot, value);
  }
}

const torch::Tensor& LiveHyperParameters::on(const c10::Device& device, double lr,
                                             double weight_decay, double momentum) {
  if (!copies_) {
    copies_ = std::make_unique<DeviceHyperCopies>();
  }
  return copies_->on(device, {lr, weight_decay, momentum});
}

}  // namespace detail
}  // namespace optim
}  // namespace lucid

// SPDX-License-Identifier: BSD-3-Clause
#pragma once

#include <c10/util/Exception.h>

#include <string>
#include <vector>

namespace lucid_test {

// Collects the messages of TORCH_WARN while alive, instead of printing them.
class ScopedWarningCollector : public c10::WarningHandler {
 public:
  ScopedWarningCollector() : previous_(c10::WarningUtils::get_warning_handler()) {
    c10::WarningUtils::set_warning_handler(this);
  }
  ~ScopedWarningCollector() override { c10::WarningUtils::set_warning_handler(previous_); }
  ScopedWarningCollector(const ScopedWarningCollector&) = delete;
  ScopedWarningCollector& operator=(const ScopedWarningCollector&) = delete;

  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }

  std::vector<std::string> messages;

 private:
  c10::WarningHandler* previous_;
};

}  // namespace lucid_test

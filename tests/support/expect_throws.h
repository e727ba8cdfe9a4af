// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Exact c10 error types. c10::ValueError and c10::NotImplementedError derive from
// c10::Error, so EXPECT_THROW(..., c10::Error) accepts any of the three, and
// EXPECT_THROW(..., c10::ValueError) any subclass of it. ThrowsExactly compares the
// dynamic type of what was thrown with the one named (a subclass is a failure) and
// checks part of the message:
//
//   EXPECT_TRUE(lucid_test::ThrowsValueError("init_scale", [&] { ...; }));
//   EXPECT_TRUE(lucid_test::ThrowsExactly<c10::NotImplementedError>("sparse", [&] { ...; }));

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>

namespace lucid_test {

// The name of a c10 error type, for failure messages (typeid names are mangled).
inline std::string c10_error_name(const std::type_info& type) {
  if (type == typeid(c10::Error)) {
    return "c10::Error";
  }
  if (type == typeid(c10::ValueError)) {
    return "c10::ValueError";
  }
  if (type == typeid(c10::NotImplementedError)) {
    return "c10::NotImplementedError";
  }
  if (type == typeid(c10::IndexError)) {
    return "c10::IndexError";
  }
  if (type == typeid(c10::TypeError)) {
    return "c10::TypeError";
  }
  return std::string("another c10::Error subclass (") + type.name() + ")";
}

// Succeeds when `f` throws exactly `E` (not a subclass of it, not another subclass of
// c10::Error) with `needle` in its message (an empty needle checks the type alone).
template <typename E, typename F>
::testing::AssertionResult ThrowsExactly(const std::string& needle, F&& f) {
  static_assert(std::is_base_of<c10::Error, E>::value, "ThrowsExactly checks c10 error types");
  const std::string expected = c10_error_name(typeid(E));
  try {
    std::forward<F>(f)();
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    if (typeid(e) != typeid(E)) {
      return ::testing::AssertionFailure() << "expected " << expected << ", got "
                                           << c10_error_name(typeid(e)) << ": " << msg;
    }
    if (msg.find(needle) == std::string::npos) {
      return ::testing::AssertionFailure() << expected << " message lacks \"" << needle
                                           << "\": " << msg;
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "expected " << expected
                                         << ", got a non-c10 exception: " << e.what();
  } catch (...) {
    return ::testing::AssertionFailure() << "expected " << expected
                                         << ", got an unknown exception";
  }
  return ::testing::AssertionFailure() << "expected " << expected << ", nothing thrown";
}

template <typename F>
::testing::AssertionResult ThrowsError(const std::string& needle, F&& f) {
  return ThrowsExactly<c10::Error>(needle, std::forward<F>(f));
}

template <typename F>
::testing::AssertionResult ThrowsValueError(const std::string& needle, F&& f) {
  return ThrowsExactly<c10::ValueError>(needle, std::forward<F>(f));
}

template <typename F>
::testing::AssertionResult ThrowsNotImplementedError(const std::string& needle, F&& f) {
  return ThrowsExactly<c10::NotImplementedError>(needle, std::forward<F>(f));
}

// The message (without backtrace) of the c10::Error, of whichever c10 type, that `f`
// throws, or "(nothing thrown)": for tests that look for several parts of one message.
// Anything else that `f` throws goes on to the test.
template <typename F>
std::string message_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "(nothing thrown)";
}

}  // namespace lucid_test

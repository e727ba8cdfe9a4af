// The version: lucid::amp::version() (compiled into the library) reports the version of
// the headers (generated from CMake's project(VERSION)), and the umbrella header has it.

#include <lucid/amp.h>

#include <gtest/gtest.h>

#include <string>

namespace {

TEST(Version, RunTimeVersionIsTheHeadersVersion) {
  EXPECT_STREQ(lucid::amp::version(), LUCID_AMP_VERSION_STRING);
}

TEST(Version, StringIsMajorMinorPatch) {
  const std::string expected = std::to_string(LUCID_AMP_VERSION_MAJOR) + "." +
                               std::to_string(LUCID_AMP_VERSION_MINOR) + "." +
                               std::to_string(LUCID_AMP_VERSION_PATCH);
  EXPECT_EQ(expected, LUCID_AMP_VERSION_STRING);
}

}  // namespace

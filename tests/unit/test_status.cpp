#include <gtest/gtest.h>

#include "util/status.h"

namespace fs {
namespace {

Expected<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("value must be positive, got " + std::to_string(v));
  return v;
}

TEST(Status, CarriesCodeMessageAndContext) {
  const Status s = corrupt("bad header").with_context("model.safetensors");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(s.to_string(), "corrupt: model.safetensors: bad header");
  EXPECT_TRUE(Status().ok());
}

TEST(Expected, HoldsValueOrError) {
  auto good = parse_positive(3);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 3);
  EXPECT_TRUE(good.status().ok());
  auto bad = parse_positive(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("-1"), std::string::npos);
}

}  // namespace
}  // namespace fs

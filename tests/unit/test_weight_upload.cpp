// The load plan (model/weight_upload.h): a checkpoint that cannot fit the device is refused with
// the numbers before anything is copied; repeats are uploaded once; and the progress meter
// (util/progress.h) draws on a terminal only.
#include <gtest/gtest.h>

#include <cstdio>
#include <deque>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/weight_upload.h"
#include "util/progress.h"

namespace fs {
namespace {

// A device with `free` bytes that records what it was asked to upload.
class FakeDevice final : public Backend {
 public:
  FakeDevice(std::uint64_t free, std::uint64_t total) : info_{free, total} {}
  std::string name() const override { return "fake"; }
  const std::shared_ptr<Memory>& memory() const override { return host_memory(); }
  Expected<Weight> upload(const Weight& w, DType matrix_dtype) override {
    uploads.push_back(w.data);
    Weight out = w;
    out.dtype = w.shape.size() >= 2 ? matrix_dtype : DType::kF32;
    out.data = reinterpret_cast<const std::uint8_t*>(&copies.emplace_back(0));
    out.device = Device::kCuda;
    return out;
  }
  std::optional<DeviceMemoryInfo> device_memory() const override { return info_; }

  std::vector<const std::uint8_t*> uploads;
  std::deque<int> copies;

 private:
  DeviceMemoryInfo info_;
};

Weight matrix(const std::vector<float>& v, std::int64_t rows, std::int64_t cols) {
  return {DType::kF32, {rows, cols}, reinterpret_cast<const std::uint8_t*>(v.data())};
}

TEST(WeightUpload, ACheckpointThatCannotFitIsRefusedWithTheNumbersBeforeAnyCopy) {
  std::vector<float> a(1000), b(500);
  Weight wa = matrix(a, 10, 100), wb = matrix(b, 5, 100);
  // 1000 + 500 floats as bf16 = 3000 bytes, and the headroom: 3000 + 1 GiB - 1 free is too little.
  FakeDevice small(kLoadHeadroomBytes + 2999, 80'000'000'000);
  const std::vector<WeightUpload> plan = {{&wa, DType::kBF16}, {&wb, DType::kBF16}};
  const Status s = upload_weights(small, plan, "the test weights");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kOutOfRange);
  EXPECT_NE(s.message().find("need 0.00 GB"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("1.07 GB free of 80.00 GB"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("nothing was uploaded"), std::string::npos);
  EXPECT_TRUE(small.uploads.empty());
  EXPECT_EQ(wa.device, Device::kHost);  // the plan's weights are untouched
  // One byte more fits.
  FakeDevice enough(kLoadHeadroomBytes + 3000, 80'000'000'000);
  ASSERT_TRUE(upload_weights(enough, plan, "the test weights").ok());
  EXPECT_EQ(enough.uploads.size(), 2u);
  EXPECT_EQ(wa.device, Device::kCuda);
  EXPECT_EQ(wa.dtype, DType::kBF16);
}

TEST(WeightUpload, DeviceBytesFollowUploadsRules) {
  std::vector<float> v(12);
  const Weight m = matrix(v, 3, 4);
  const Weight vec{DType::kBF16, {12}, reinterpret_cast<const std::uint8_t*>(v.data())};
  const Weight table{DType::kI64, {6}, reinterpret_cast<const std::uint8_t*>(v.data())};
  EXPECT_EQ(device_bytes(m, DType::kBF16), 24u);
  EXPECT_EQ(device_bytes(m, DType::kF32), 48u);
  EXPECT_EQ(device_bytes(vec, DType::kBF16), 48u);    // vectors become f32
  EXPECT_EQ(device_bytes(table, DType::kBF16), 24u);  // index tables become int32
  // Block-scaled FP8 [2, 200, 300] stays as stored: the codes and 2 x 2x3 f32 block scales.
  std::vector<std::uint8_t> codes(2 * 200 * 300);
  Weight fp8{DType::kF8E4M3, {2, 200, 300}, codes.data()};
  fp8.scales.data = reinterpret_cast<const std::uint8_t*>(v.data());
  EXPECT_EQ(device_bytes(fp8, DType::kBF16), 120'000u + 2 * 6 * 4);
  EXPECT_EQ(device_bytes(fp8, DType::kF32), 120'000u + 2 * 6 * 4);
  // E8M0 scales (DeepSeek V4) become f32 on a device: 4 bytes a block there.
  fp8.scales.format = quant::ScaleFormat::kE8M0;
  EXPECT_EQ(device_bytes(fp8, DType::kBF16), 120'000u + 2 * 6 * 4);
  // Packed formats stay as stored: Q4_K rows of whole 144-byte blocks, FP4 with its per-32 E8M0
  // bytes ([4, 64]: 32 bytes and 2 scales a row).
  Weight q4{DType::kU8, {3, 512}, codes.data()};
  q4.packed = quant::QuantType::kQ4_K;
  EXPECT_EQ(device_bytes(q4, DType::kBF16), 3u * 2 * 144);
  Weight fp4{DType::kU8, {4, 64}, codes.data()};
  fp4.packed = quant::QuantType::kF4E2M1x2;
  fp4.scales = {codes.data(), quant::ScaleFormat::kE8M0, 1, 32};
  EXPECT_EQ(device_bytes(fp4, DType::kF32), 4u * 32 + 4 * 2);
}

TEST(WeightUpload, ARepeatIsUploadedOnceAndAViewOfFewerRowsIsNot) {
  std::vector<float> e(40);
  Weight embed = matrix(e, 10, 4), tied = embed, head_rows = embed.first_rows(5);
  FakeDevice dev(kLoadHeadroomBytes * 2, kLoadHeadroomBytes * 4);
  const std::vector<WeightUpload> plan = {
      {&embed, DType::kF32}, {&tied, DType::kF32}, {&head_rows, DType::kF32}};
  ASSERT_TRUE(upload_weights(dev, plan, "x").ok());
  EXPECT_EQ(dev.uploads.size(), 2u);
  EXPECT_EQ(tied.data, embed.data);       // the same device copy
  EXPECT_NE(head_rows.data, embed.data);  // its own
  EXPECT_EQ(head_rows.rows(), 5);
}

TEST(ProgressLine, SaysDoneTotalRateAndTimeLeft) {
  EXPECT_EQ(progress_line("loading x", 12'300'000'000, 40'100'000'000, 6.15),
            "loading x: 12.3 / 40.1 GB  2.00 GB/s  14 s left");
  EXPECT_EQ(progress_line("convert", 0, 500'000'000, 0), "convert: 0.0 / 500.0 MB");
  EXPECT_EQ(progress_line("convert", 100'000'000, 500'000'000, 2),
            "convert: 100.0 / 500.0 MB  50.0 MB/s  8 s left");
  EXPECT_EQ(progress_line("l", 1'000'000'000, 1'000'000'000'000, 1),
            "l: 1.0 / 1000.0 GB  1.00 GB/s  16 min 39 s left");
  EXPECT_EQ(progress_done_line("loading x", 40'100'000'000, 20.05),
            "loading x: 40.1 GB in 20.1 s (2.00 GB/s)");
}

std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s.push_back(static_cast<char>(c));
  return s;
}

TEST(ProgressMeter, SilentWhenNotATerminalAndDrawsInPlaceWhenForced) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    ProgressMeter m("loading", 1000, file);
    EXPECT_FALSE(m.active());
    m.add(1000);
  }
  EXPECT_EQ(contents(file), "");
  std::fclose(file);

  std::FILE* tty = std::tmpfile();
  {
    ProgressMeter m("loading", 1000, tty, /*force=*/true);
    m.add(400);
    m.add(600);  // the end is always drawn, however soon
  }
  const auto out = contents(tty);
  EXPECT_EQ(out.rfind("\rloading: 0.0 / 0.0 MB", 0), 0u) << out;
  EXPECT_NE(out.find("loading: 0.0 MB in "), std::string::npos) << out;
  EXPECT_EQ(out.back(), '\n');
  std::fclose(tty);

  // A failed job erases the meter and leaves the line to its error message.
  std::FILE* failed = std::tmpfile();
  {
    ProgressMeter m("loading", 1000, failed, true);
    m.finish(false);
  }
  const auto f = contents(failed);
  EXPECT_EQ(f.find(" in "), std::string::npos) << f;
  EXPECT_EQ(f.back(), '\r');
  std::fclose(failed);
}

}  // namespace
}  // namespace fs

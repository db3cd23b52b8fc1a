// A fake device for upload tests: it reports `free` bytes of device memory and keeps a host copy
// of every weight it is given (a packed weight's codes; others keep pointing at the caller's
// data), so a test can check what a load would have copied and when.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "tensor/memory.h"

namespace fs::test {

class RecordingDevice final : public Backend {
 public:
  explicit RecordingDevice(std::uint64_t free) : info_{free, free * 2} {}
  std::string name() const override { return "recording"; }
  const std::shared_ptr<Memory>& memory() const override { return host_memory(); }
  Expected<Weight> upload(const Weight& w, DType) override {
    auto& copy = copies.emplace_back(w.data, w.data + (w.is_packed() ? w.bytes() : 0));
    Weight out = w;
    out.data = copy.data();
    return out;
  }
  std::optional<DeviceMemoryInfo> device_memory() const override { return info_; }
  std::deque<std::vector<std::uint8_t>> copies;

 private:
  DeviceMemoryInfo info_;
};

}  // namespace fs::test

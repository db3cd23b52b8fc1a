#include "model/weight_upload.h"

#include <cstdio>
#include <map>

#include "util/progress.h"

namespace fs {
namespace {

std::string gb(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(bytes) / 1e9);
  return buf;
}

}  // namespace

std::uint64_t device_bytes(const Weight& w, DType dtype) {
  const auto n = static_cast<std::uint64_t>(w.numel());
  if (w.dtype == DType::kI32 || w.dtype == DType::kI64) return n * 4;
  // Block-scaled and packed weights stay as stored (codes or blocks, and scales), whatever
  // `dtype` asks; E8M0 scales of 128x128 FP8 blocks become f32 on a device (upload_stored).
  if (w.block_scaled() && !w.is_packed() && w.scales.format == quant::ScaleFormat::kE8M0)
    return w.bytes() + w.scale_bytes() * sizeof(float);
  if (w.block_scaled() || w.is_packed()) return w.bytes() + w.scale_bytes();
  return n * (w.shape.size() >= 2 ? dtype_size(dtype) : 4);
}

Status check_fits(const Backend& be, std::uint64_t need, const std::string& what) {
  const auto mem = be.device_memory();
  if (!mem) return {};
  if (need + kLoadHeadroomBytes <= mem->free) return {};
  return out_of_range(what + ": the weights need " + gb(need) + " on the " + be.name() +
                      " device, which has " + gb(mem->free) + " free of " + gb(mem->total) +
                      " (a load keeps " + gb(kLoadHeadroomBytes) +
                      " beyond the weights for activations and caches); nothing was uploaded. "
                      "Use a quantised checkpoint, --dtype bf16 if the weights are f32, or the "
                      "cpu backend");
}

Status upload_weights(Backend& be, std::span<const WeightUpload> items, const std::string& what,
                      std::uint64_t later_bytes) {
  std::uint64_t need = later_bytes, stored = 0;
  // A repeat is the same bytes: the same start and the same size (a first_rows view of a
  // matrix starts where the matrix does, and is not a repeat).
  using Key = std::pair<const std::uint8_t*, std::int64_t>;
  std::map<Key, Weight> done;
  for (const auto& it : items) {
    if (it.weight->empty() || done.count({it.weight->data, it.weight->numel()}) != 0) continue;
    done.emplace(Key{it.weight->data, it.weight->numel()}, Weight{});
    need += device_bytes(*it.weight, it.dtype);
    stored += it.weight->bytes();
  }
  if (Status s = check_fits(be, need, what); !s.ok()) return s;
  // Only a copy to a device is worth a meter (the CPU maps the checkpoint in place).
  const bool copies = be.device_memory().has_value();
  ProgressMeter meter("loading " + what, stored, copies ? stderr : nullptr);
  done.clear();
  for (const auto& it : items) {
    Weight& w = *it.weight;
    if (w.empty()) continue;
    const Key key{w.data, w.numel()};
    if (const auto d = done.find(key); d != done.end()) {
      w = d->second;
      continue;
    }
    const auto bytes = w.bytes();
    auto up = be.upload(w, it.dtype);
    if (!up.ok()) {
      meter.finish(false);
      return up.status();
    }
    w = *up;
    done.emplace(key, w);
    meter.add(bytes);
  }
  return {};
}

}  // namespace fs

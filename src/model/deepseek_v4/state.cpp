#include "model/deepseek_v4/state.h"

#include <algorithm>

#include "backend/backend.h"

namespace fs {
namespace {

const char* kind_name(DsAttentionKind k) {
  switch (k) {
    case DsAttentionKind::kSliding:
      return "swa";
    case DsAttentionKind::kCompressedSparse:
      return "csa";
    case DsAttentionKind::kHeavilyCompressed:
      return "hca";
  }
  return "swa";
}

DsCompressorState compressor_state(std::int64_t width, std::int64_t out, std::int64_t ratio,
                                   bool overlap, const std::shared_ptr<Memory>& memory) {
  DsCompressorState s;
  s.kv = Tensor(memory, {0, width});
  s.gate = Tensor(memory, {0, width});
  s.rows = Tensor(memory, {0, out});
  s.ratio = ratio;
  s.overlap = overlap;
  return s;
}

std::int64_t window_from(std::int64_t position, std::int64_t ratio, bool overlap) {
  auto w = std::max<std::int64_t>(position, 0) / ratio * ratio;
  if (overlap) w -= ratio;
  return std::max<std::int64_t>(w, 0);
}

// Copies `view` (rows x cols, rows in [min_rows, max_rows]) into a fresh tensor in `memory`.
Status load_rows(const StateTensorView& view, std::int64_t cols, std::int64_t min_rows,
                 std::int64_t max_rows, const std::shared_ptr<Memory>& memory, Tensor& dst) {
  const bool fits = view.shape.size() == 2 && view.shape[1] == cols && view.shape[0] >= min_rows &&
                    view.shape[0] <= max_rows &&
                    static_cast<std::int64_t>(view.data.size()) == shape_numel(view.shape);
  if (!fits)
    return invalid_argument("state tensor " + view.name + " has shape " +
                            shape_to_string(view.shape) + ", expected [" +
                            std::to_string(min_rows) + ".." + std::to_string(max_rows) + ", " +
                            std::to_string(cols) + "]");
  if (!dst.allocate(memory, view.shape))
    return out_of_range("out of " + device_name(memory->device()) +
                        " memory loading state tensor " + view.name);
  dst.copy_from_host(view.data);
  return {};
}

const StateTensorView* find_view(std::span<const StateTensorView> tensors,
                                 const std::string& name) {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace

std::int64_t DsCompressorState::keep_from(std::int64_t covered) const {
  return window_from(covered - kDsRollbackSlack, ratio, overlap);
}

std::int64_t DsCompressorState::needed_from(std::int64_t length) const {
  return window_from(length, ratio, overlap);
}

DsAttentionCache::DsAttentionCache(const DeepseekV4Config& c, DsAttentionKind kind,
                                   const std::shared_ptr<Memory>& memory)
    : layer_kind(kind), window(c.sliding_window), raw(memory, {0, c.head_dim}) {
  const auto ratio = c.compress_rate(kind);
  if (kind == DsAttentionKind::kHeavilyCompressed) {
    compressor = compressor_state(c.head_dim, c.head_dim, ratio, false, memory);
  } else if (kind == DsAttentionKind::kCompressedSparse) {
    compressor = compressor_state(2 * c.head_dim, c.head_dim, ratio, true, memory);
    indexer = compressor_state(2 * c.index_head_dim, c.index_head_dim, ratio, true, memory);
  }
}

std::string DsAttentionCache::kind() const {
  return kind_name(layer_kind);
}

std::unique_ptr<LayerCache> DsAttentionCache::clone() const {
  return std::make_unique<DsAttentionCache>(*this);
}

std::int64_t DsAttentionCache::raw_keep(std::int64_t covered_tokens) const {
  return std::min(covered_tokens, window - 1 + kDsRollbackSlack);
}

bool DsAttentionCache::can_truncate(std::int64_t length) const {
  if (length < 0 || length > covered) return false;
  if (std::max<std::int64_t>(length - window + 1, 0) < raw_first()) return false;
  for (const auto* c : {&compressor, &indexer}) {
    if (*c && (*c)->needed_from(length) < covered - (*c)->kv.rows()) return false;
  }
  return true;
}

Status DsAttentionCache::truncate(std::int64_t length) {
  if (!can_truncate(length))
    return failed_precondition(kind() + " cache covering " + std::to_string(covered) +
                               " tokens keeps too few rows to go back to " +
                               std::to_string(length));
  // Every buffer loses its rows at positions >= length; first positions stay where they were.
  raw.shrink_rows(raw.rows() - (covered - length));
  for (auto* c : {&compressor, &indexer}) {
    if (!*c) continue;
    auto& s = **c;
    s.kv.shrink_rows(s.kv.rows() - (covered - length));
    s.gate.shrink_rows(s.gate.rows() - (covered - length));
    s.rows.shrink_rows(length / s.ratio);
  }
  covered = length;
  return {};
}

void DsAttentionCache::trim(Backend& be) {
  auto cut = [&](Tensor& t, std::int64_t keep) {
    if (t.rows() <= keep) return;
    Tensor kept;
    be.slice_rows(t, t.rows() - keep, keep, kept);
    t = std::move(kept);
  };
  cut(raw, raw_keep(covered));
  for (auto* c : {&compressor, &indexer}) {
    if (!*c) continue;
    const auto keep = covered - (*c)->keep_from(covered);
    cut((*c)->kv, keep);
    cut((*c)->gate, keep);
  }
}

std::size_t DsAttentionCache::bytes() const {
  auto total = static_cast<std::size_t>(raw.numel());
  for (const auto* c : {&compressor, &indexer}) {
    if (*c)
      total += static_cast<std::size_t>((*c)->kv.numel() + (*c)->gate.numel() + (*c)->rows.numel());
  }
  return total * sizeof(float);
}

std::vector<StateTensor> DsAttentionCache::tensors() const {
  std::vector<StateTensor> out = {{"raw", &raw}};
  for (const auto& [name, c] : {std::pair{"compressor", &compressor}, {"indexer", &indexer}}) {
    if (!*c) continue;
    const std::string p = name;
    out.push_back({p + ".kv", &(*c)->kv});
    out.push_back({p + ".gate", &(*c)->gate});
    out.push_back({p + ".rows", &(*c)->rows});
  }
  return out;
}

Status DsAttentionCache::load(std::span<const StateTensorView> t, std::int64_t n) {
  const auto& memory = raw.memory();
  DsAttentionCache loaded(*this);
  // Names this cache does not have are refused (another layer kind's state).
  for (const auto& view : t) {
    bool known = false;
    for (const auto& own : tensors()) known = known || own.name == view.name;
    if (!known)
      return invalid_argument("state tensor " + view.name + " is not a " + kind() +
                              " cache tensor");
  }
  auto need = [&](const std::string& name) -> Expected<const StateTensorView*> {
    const auto* v = find_view(t, name);
    if (v == nullptr) return not_found("state tensor " + name + " is missing");
    return v;
  };
  auto raw_view = need("raw");
  if (!raw_view.ok()) return raw_view.status();
  if (auto s = load_rows(**raw_view, raw.cols(), std::min(n, window - 1), n, memory, loaded.raw);
      !s.ok())
    return s;
  for (auto [name, c] :
       {std::pair{"compressor", &loaded.compressor}, {"indexer", &loaded.indexer}}) {
    if (!*c) continue;
    auto& s = **c;
    const std::string p = name;
    const auto min_rows = n - s.needed_from(n);
    for (auto [part, dst] : {std::pair{".kv", &s.kv}, {".gate", &s.gate}}) {
      auto v = need(p + part);
      if (!v.ok()) return v.status();
      if (auto st = load_rows(**v, dst->cols(), min_rows, n, memory, *dst); !st.ok()) return st;
    }
    if (s.kv.rows() != s.gate.rows())
      return invalid_argument("state tensors " + p + ".kv and " + p + ".gate differ in rows");
    auto v = need(p + ".rows");
    if (!v.ok()) return v.status();
    if (auto st = load_rows(**v, s.rows.cols(), n / s.ratio, n / s.ratio, memory, s.rows); !st.ok())
      return st;
  }
  loaded.covered = n;
  *this = std::move(loaded);
  return {};
}

std::unique_ptr<ModelState> new_deepseek_v4_state(const DeepseekV4Config& c,
                                                  const std::shared_ptr<Memory>& memory) {
  std::vector<std::unique_ptr<LayerCache>> caches;
  for (const auto kind : c.layer_types)
    caches.push_back(std::make_unique<DsAttentionCache>(c, kind, memory));
  return std::make_unique<ModelState>(std::move(caches));
}

}  // namespace fs

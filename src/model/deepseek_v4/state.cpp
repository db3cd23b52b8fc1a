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
  s.kv_slack = Tensor(memory, {0, width});
  s.gate_slack = Tensor(memory, {0, width});
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

// The rows of positions [from, to) of slack ++ buffer (buffer's last row at position end - 1),
// copied into `out` in the same memory; false when the memory is exhausted.
bool gather_rows(const Tensor& slack, const Tensor& buffer, std::int64_t end, std::int64_t from,
                 std::int64_t to, Tensor& out) {
  const auto cols = buffer.cols();
  const auto row_bytes = static_cast<std::size_t>(cols) * sizeof(float);
  if (!out.allocate(buffer.memory(), {to - from, cols})) return false;
  const auto buffer_first = end - buffer.rows(), slack_first = buffer_first - slack.rows();
  auto copy = [&](const Tensor& src, std::int64_t src_first) {
    const auto lo = std::max(from, src_first), hi = std::min(to, src_first + src.rows());
    if (hi <= lo) return;
    buffer.memory()->copy(
        static_cast<char*>(out.raw()) + static_cast<std::size_t>(lo - from) * row_bytes,
        static_cast<const char*>(src.raw()) + static_cast<std::size_t>(lo - src_first) * row_bytes,
        static_cast<std::size_t>(hi - lo) * row_bytes);
  };
  copy(slack, slack_first);
  copy(buffer, buffer_first);
  return true;
}

// Goes back to `length`: the buffer becomes positions [buffer_from, length), the slack the kept
// positions before it (from where the slack began). The caller checked they are all there.
bool rewind_rows(Tensor& slack, Tensor& buffer, std::int64_t end, std::int64_t length,
                 std::int64_t buffer_from) {
  const auto slack_first = end - buffer.rows() - slack.rows();
  Tensor s, b;
  if (!gather_rows(slack, buffer, end, slack_first, buffer_from, s) ||
      !gather_rows(slack, buffer, end, buffer_from, length, b))
    return false;
  slack = std::move(s);
  buffer = std::move(b);
  return true;
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

std::int64_t DsAttentionCache::raw_rows(std::int64_t length) const {
  return std::min(length, window - 1);
}

bool DsAttentionCache::can_truncate(std::int64_t length) const {
  if (length < 0 || length > covered) return false;
  const auto raw_from = covered - raw.rows() - raw_slack.rows();
  if (length - raw_rows(length) < raw_from) return false;
  for (const auto* c : {&compressor, &indexer}) {
    if (!*c) continue;
    const auto from = covered - (*c)->kv.rows() - (*c)->kv_slack.rows();
    if ((*c)->needed_from(length) < from) return false;
  }
  return true;
}

Status DsAttentionCache::truncate(std::int64_t length) {
  if (!can_truncate(length))
    return failed_precondition(kind() + " cache covering " + std::to_string(covered) +
                               " tokens keeps too few rows to go back to " +
                               std::to_string(length));
  if (length == covered) return {};
  // Every buffer becomes what a state covering `length` holds, from its slack and itself.
  const auto oom = [&] {
    return out_of_range("out of " + device_name(raw.memory()->device()) + " memory truncating a " +
                        kind() + " cache");
  };
  if (!rewind_rows(raw_slack, raw, covered, length, length - raw_rows(length))) return oom();
  for (auto* c : {&compressor, &indexer}) {
    if (!*c) continue;
    auto& s = **c;
    const auto from = s.needed_from(length);
    if (!rewind_rows(s.kv_slack, s.kv, covered, length, from) ||
        !rewind_rows(s.gate_slack, s.gate, covered, length, from))
      return oom();
    s.rows.shrink_rows(length / s.ratio);
  }
  covered = length;
  return {};
}

void DsAttentionCache::trim(Backend& be) {
  // buffer keeps its last `keep` rows; the rows before them join the slack, which keeps its
  // last `keep_slack`.
  auto shift = [&](Tensor& slack, Tensor& buffer, std::int64_t keep, std::int64_t keep_slack) {
    if (buffer.rows() > keep) {
      Tensor moved, kept;
      be.slice_rows(buffer, 0, buffer.rows() - keep, moved);
      be.append_rows(slack, moved);
      be.slice_rows(buffer, buffer.rows() - keep, keep, kept);
      buffer = std::move(kept);
    }
    if (slack.rows() > keep_slack) {
      Tensor kept;
      be.slice_rows(slack, slack.rows() - keep_slack, keep_slack, kept);
      slack = std::move(kept);
    }
  };
  shift(raw_slack, raw, raw_rows(covered), kDsRollbackSlack);
  for (auto* c : {&compressor, &indexer}) {
    if (!*c) continue;
    auto& s = **c;
    const auto from = s.needed_from(covered);
    const auto keep_slack = from - s.keep_from(covered);
    shift(s.kv_slack, s.kv, covered - from, keep_slack);
    shift(s.gate_slack, s.gate, covered - from, keep_slack);
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
  if (auto s = load_rows(**raw_view, raw.cols(), raw_rows(n), raw_rows(n), memory, loaded.raw);
      !s.ok())
    return s;
  loaded.raw_slack = Tensor(memory, {0, raw.cols()});
  for (auto [name, c] :
       {std::pair{"compressor", &loaded.compressor}, {"indexer", &loaded.indexer}}) {
    if (!*c) continue;
    auto& s = **c;
    const std::string p = name;
    const auto rows = n - s.needed_from(n);
    for (auto [part, dst] : {std::pair{".kv", &s.kv}, {".gate", &s.gate}}) {
      auto v = need(p + part);
      if (!v.ok()) return v.status();
      if (auto st = load_rows(**v, dst->cols(), rows, rows, memory, *dst); !st.ok()) return st;
    }
    s.kv_slack = Tensor(memory, {0, s.kv.cols()});
    s.gate_slack = Tensor(memory, {0, s.gate.cols()});
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

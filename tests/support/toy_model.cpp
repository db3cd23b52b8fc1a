#include "toy_model.h"

#include <cmath>
#include <cstring>

namespace fs::test {
namespace {

float hash_weight(std::uint32_t seed, std::uint32_t a, std::uint32_t b) {
  std::uint32_t x =
      seed * 0x9E3779B1u ^ (a + 0x7F4A7C15u) * 0x85EBCA6Bu ^ (b + 0x165667B1u) * 0xC2B2AE35u;
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 12;
  x *= 0x297A2D39u;
  x ^= x >> 15;
  return static_cast<float>(x % 20001u) / 10000.0f - 1.0f;  // [-1, 1]
}

// A cache of float rows: the recurrent variant holds one row (the state) and cannot truncate;
// the positional variant holds one row per token and can.
class RowsCache : public LayerCache {
 public:
  RowsCache(std::string kind, std::int64_t width, bool positional)
      : kind_(std::move(kind)), width_(width), positional_(positional) {
    if (!positional_) data_.assign(static_cast<std::size_t>(width_), 0.0f);
  }
  std::string kind() const override { return kind_; }
  std::int64_t covered_tokens() const override { return covered_; }
  std::unique_ptr<LayerCache> clone() const override { return std::make_unique<RowsCache>(*this); }
  bool can_truncate(std::int64_t length) const override {
    return length == covered_ || (positional_ && length >= 0 && length <= covered_);
  }
  Status truncate(std::int64_t length) override {
    if (length == covered_) return {};
    if (!positional_ || length > covered_ || length < 0) {
      return failed_precondition(kind_ + " cannot truncate from " + std::to_string(covered_) +
                                 " to " + std::to_string(length));
    }
    data_.resize(static_cast<std::size_t>(length * width_));
    covered_ = length;
    return {};
  }
  std::size_t bytes() const override { return data_.size() * sizeof(float); }
  std::vector<StateTensor> tensors() const override {
    const std::int64_t rows = positional_ ? covered_ : 1;
    // The rows live in data_ (host); the view is a tensor copied from them on demand.
    snapshot_ = Tensor({rows, width_}, data_);
    return {{"rows", &snapshot_}};
  }
  Status load(std::span<const StateTensorView> t, std::int64_t covered) override {
    const std::int64_t rows = positional_ ? covered : 1;
    if (t.size() != 1 || t[0].name != "rows" || t[0].shape != Shape{rows, width_}) {
      return invalid_argument(kind_ + ": tensors do not fit");
    }
    data_.assign(t[0].data.begin(), t[0].data.end());
    covered_ = covered;
    return {};
  }

  std::vector<float> data_;
  std::int64_t covered_ = 0;

 private:
  mutable Tensor snapshot_;
  std::string kind_;
  std::int64_t width_;
  bool positional_;
};

RowsCache& rows_cache(ModelState& s, std::size_t i) {
  return static_cast<RowsCache&>(s.cache(i));
}

std::vector<float> mean_rows(const RowsCache& c, std::int64_t width) {
  std::vector<float> m(static_cast<std::size_t>(width), 0.0f);
  if (c.covered_ == 0) return m;
  for (std::int64_t r = 0; r < c.covered_; ++r) {
    for (std::int64_t i = 0; i < width; ++i)
      m[static_cast<std::size_t>(i)] += c.data_[static_cast<std::size_t>(r * width + i)];
  }
  for (auto& v : m) v /= static_cast<float>(c.covered_);
  return m;
}

class ToyHead : public MtpHead {
 public:
  explicit ToyHead(const ToyModel& model) : model_(model) {}
  std::unique_ptr<ModelState> new_history() const override {
    std::vector<std::unique_ptr<LayerCache>> caches;
    caches.push_back(std::make_unique<RowsCache>("toy_mtp_history", model_.config().width, true));
    return std::make_unique<ModelState>(std::move(caches));
  }
  std::int64_t hidden_width() const override { return model_.config().width; }
  Status forward(ModelState& history, std::span<const float> hidden,
                 std::span<const TokenId> tokens, LogitsRows rows, ForwardOutput& out) override {
    const auto w = model_.config().width, v = model_.config().vocab;
    auto& cache = rows_cache(history, 0);
    out = {};
    out.hidden_width = w;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      std::vector<float> h2(static_cast<std::size_t>(w));
      model_.step(hidden.subspan(i * static_cast<std::size_t>(w), static_cast<std::size_t>(w)),
                  tokens[i], h2);
      // The history row mixes the input hidden and the token: what the head "attends" to.
      for (std::int64_t j = 0; j < w; ++j) {
        cache.data_.push_back(
            0.5f * hidden[i * static_cast<std::size_t>(w) + static_cast<std::size_t>(j)] +
            model_.embed(tokens[i], j));
      }
      ++cache.covered_;
      out.hidden.insert(out.hidden.end(), h2.begin(), h2.end());
      const bool want =
          rows == LogitsRows::kAll || (rows == LogitsRows::kLast && i + 1 == tokens.size());
      if (want) {
        std::vector<float> l(static_cast<std::size_t>(v));
        model_.logits(h2, mean_rows(cache, w), l);
        out.logits.insert(out.logits.end(), l.begin(), l.begin() + draft_vocabulary());
        ++out.rows;
      }
    }
    return {};
  }
  Status set_draft_vocabulary(std::int64_t n) override {
    if (n < 0 || n > model_.config().vocab) return invalid_argument("draft vocabulary");
    draft_vocab_ = n;
    return {};
  }
  std::int64_t draft_vocabulary() const override {
    return draft_vocab_ > 0 ? draft_vocab_ : model_.config().vocab;
  }

 private:
  const ToyModel& model_;
  std::int64_t draft_vocab_ = 0;
};

}  // namespace

ToyModel::ToyModel(ToyConfig config) : config_(config) {
  info_.family = Family::kQwenNext;
  info_.vocab_size = config_.vocab;
  info_.hidden_size = config_.width;
  info_.has_mtp = config_.with_mtp;
  const auto V = static_cast<std::uint32_t>(config_.vocab),
             W = static_cast<std::uint32_t>(config_.width);
  for (std::uint32_t t = 0; t < V; ++t) {
    for (std::uint32_t i = 0; i < W; ++i) {
      embed_.push_back(hash_weight(config_.seed, 1000 + t, i));
      w_out_.push_back(hash_weight(config_.seed, 2000 + t, i));
      u_.push_back(hash_weight(config_.seed, 3000 + t, i));
    }
  }
  for (std::uint32_t i = 0; i < W * W; ++i) a_.push_back(0.9f * hash_weight(config_.seed, 4000, i));
  if (config_.with_mtp) head_ = std::make_unique<ToyHead>(*this);
}

ToyModel::~ToyModel() = default;

MtpHead* ToyModel::mtp() {
  return head_.get();
}

float ToyModel::embed(TokenId t, std::int64_t i) const {
  return embed_[static_cast<std::size_t>(t * config_.width + i)];
}

void ToyModel::step(std::span<const float> h, TokenId t, std::span<float> out) const {
  const auto W = config_.width;
  for (std::int64_t i = 0; i < W; ++i) {
    float acc = embed(t, i);
    for (std::int64_t j = 0; j < W; ++j)
      acc += a_[static_cast<std::size_t>(i * W + j)] * h[static_cast<std::size_t>(j)];
    out[static_cast<std::size_t>(i)] = std::tanh(acc);
  }
}

void ToyModel::logits(std::span<const float> h, std::span<const float> m,
                      std::span<float> out) const {
  const auto W = config_.width;
  for (std::int64_t v = 0; v < config_.vocab; ++v) {
    float acc = 0;
    for (std::int64_t i = 0; i < W; ++i) {
      acc += w_out_[static_cast<std::size_t>(v * W + i)] * h[static_cast<std::size_t>(i)] +
             u_[static_cast<std::size_t>(v * W + i)] * m[static_cast<std::size_t>(i)];
    }
    out[static_cast<std::size_t>(v)] = config_.logit_scale * acc;
  }
}

std::unique_ptr<ModelState> ToyModel::new_state() const {
  std::vector<std::unique_ptr<LayerCache>> caches;
  caches.push_back(std::make_unique<RowsCache>("toy_recurrent", config_.width, false));
  caches.push_back(std::make_unique<RowsCache>("toy_kv", config_.width, true));
  return std::make_unique<ModelState>(std::move(caches));
}

// The rows stay on the host whatever HiddenRows asks (no backend): callers take either form.
Status ToyModel::forward(ModelState& state, std::span<const TokenId> tokens, LogitsRows rows,
                         ForwardOutput& out, HiddenRows) {
  ++forwards;
  if (fail_in >= 0 && fail_in-- == 0) return internal_error("injected forward failure");
  for (TokenId t : tokens) {
    if (t < 0 || t >= config_.vocab)
      return invalid_argument("token id " + std::to_string(t) + " out of range");
  }
  auto& rec = rows_cache(state, 0);
  auto& kv = rows_cache(state, 1);
  const auto W = config_.width;
  out = {};
  out.hidden_width = W;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    std::vector<float> h(static_cast<std::size_t>(W));
    step(rec.data_, tokens[i], h);
    rec.data_ = h;
    ++rec.covered_;
    for (std::int64_t j = 0; j < W; ++j) kv.data_.push_back(embed(tokens[i], j));
    ++kv.covered_;
    out.hidden.insert(out.hidden.end(), h.begin(), h.end());
    const bool want =
        rows == LogitsRows::kAll || (rows == LogitsRows::kLast && i + 1 == tokens.size());
    if (want) {
      std::vector<float> l(static_cast<std::size_t>(config_.vocab));
      logits(h, mean_rows(kv, W), l);
      out.logits.insert(out.logits.end(), l.begin(), l.end());
      ++out.rows;
    }
  }
  return {};
}

}  // namespace fs::test

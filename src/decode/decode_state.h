// The committed state of a sequence, and the only ways tokens enter it.
//
// `tokens` is the key: exactly the tokens the trunk has absorbed. Tokens enter through
// extend() (a forward) or absorb() (the output of a forward already run, e.g. a verify), and
// both append to the key, the trunk and the MTP history together. A token that was emitted but
// not forwarded is therefore never part of the key: the key cannot claim more than the state
// covers (the DS4Server bug class).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "model/model.h"
#include "model/mtp.h"

namespace fs {

struct DecodeState {
  std::vector<TokenId> tokens;
  std::unique_ptr<ModelState> trunk;
  // One row per token t >= 1: head(h_{t-1}, x_t). Null when the model has no MTP head.
  std::unique_ptr<ModelState> mtp_history;
  // The distribution of the token after `tokens`: on the host, or, after a forward that kept
  // its logits on the backend (greedy decoding), as row `next_logits_row` of
  // `next_logits_device` with its argmax in `next_argmax` (next_logits then empty).
  std::vector<float> next_logits;
  Tensor next_logits_device;
  std::int64_t next_logits_row = 0;
  std::optional<TokenId> next_argmax;
  std::vector<float> last_hidden;  // trunk hidden at the last position (MTP input)

  // trunk and history coverage agree with the key; logits present once a token is covered.
  Status check_invariant() const;
  DecodeState clone() const;
  bool has_logits() const { return !next_logits.empty() || next_logits_device.numel() > 0; }
  // The next-token logits on the host (copied back when they stayed on the backend).
  std::vector<float> host_logits() const;
  // Makes next_logits hold the values (one copy back, the first time after a backend forward)
  // and lets the device row go.
  void materialize_logits();
};

DecodeState new_decode_state(Model& model);

// Forwards `tokens` through the trunk in calls of at most `chunk` tokens (0: one call) and
// absorbs them. `last` is kLast (logits to the host) or kLastArgmax (greedy: only the argmax
// id comes back, the logits stay on the backend).
Status extend(Model& model, DecodeState& state, std::span<const TokenId> tokens,
              std::int64_t chunk = 0, LogitsRows last = LogitsRows::kLast);

// Records `tokens`, which the trunk has just absorbed with output `out` (logits of at least the
// last row, or their argmax and device rows; hidden of every row), in the key, the MTP history,
// the next logits and last_hidden. Device logits are moved from `out`, not copied.
Status absorb(Model& model, DecodeState& state, std::span<const TokenId> tokens,
              ForwardOutput&& out);

// What speculative rollback needs. Before a verify of `tokens` tokens, caches that truncate need
// nothing; recurrent caches are asked to keep the state after each of its tokens
// (LayerCache::keep_positions), so a partial acceptance truncates the state in place to the
// kept length, no second forward. When some recurrent cache cannot, every recurrent cache is
// cloned instead, and a rollback restores the clones and forwards the kept tokens again.
class RollbackPoint {
 public:
  static RollbackPoint take(ModelState& state, std::int64_t tokens);
  // Whether the verify kept its positions: rewind() applies, restore() does not.
  bool in_place() const { return clones_.empty(); }
  // In place: `state` (after the verify) back to `kept` of the verify's tokens.
  Status rewind(ModelState& state, std::int64_t kept) const;
  // Clones: `state` back to the taken point. The point stays valid for another restore.
  Status restore(ModelState& state) const;

 private:
  std::int64_t length_ = 0;
  std::vector<std::unique_ptr<LayerCache>> clones_;  // null for caches that truncate
};

// The first `rows` rows of a forward's output (logits, ids, device rows and hidden rows), for
// absorbing the accepted prefix of a verify.
ForwardOutput first_rows(ForwardOutput&& out, std::int64_t rows, std::int64_t vocab);

}  // namespace fs

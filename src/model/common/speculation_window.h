// What a recurrent cache keeps about its last forward when an MTP verify asked for it
// (LayerCache::keep_positions), so that truncate() can go back to any length inside that forward
// by copying instead of recomputing (issue 14: per-position capture in verify).
//
// A recurrent cache holds no history, so "the state after token j of the forward" must be saved
// while the forward runs: the delta-rule state after each token (`states`), and the inputs a conv
// tail is cut from (`history` = the tail before the forward followed by the forward's conv
// inputs: the tail after token j is rows [j+1, j+1+L) of it). `ids` is host bookkeeping of the
// same kind (the PLE n-gram context followed by the forward's tokens).
//
// The window describes one forward of one cache: any later forward replaces or clears it, a
// truncate consumes it, and a copy of the cache starts without one (copying it would only cost
// memory: a clone is a different cache whose next forward opens its own).
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace fs {

struct SpeculationWindow {
  std::int64_t requested = 0;  // tokens keep_positions asked for; 0: the next forward keeps none
  std::int64_t first = -1;     // covered tokens before the forward it describes; -1: no window
  std::int64_t tokens = 0;     // tokens of that forward
  Tensor states;               // [tokens, state numel]: the recurrent state after each token
  Tensor history;              // [L + tokens, C]: the conv tail before, then the conv inputs
  std::vector<std::int64_t> ids;

  SpeculationWindow() = default;
  SpeculationWindow(const SpeculationWindow&) {}
  SpeculationWindow& operator=(const SpeculationWindow&) {
    clear();
    requested = 0;
    return *this;
  }
  SpeculationWindow(SpeculationWindow&&) noexcept = default;
  SpeculationWindow& operator=(SpeculationWindow&&) noexcept = default;

  // Called by the forward of `n` tokens over a cache that covered `covered`: whether this forward
  // keeps its positions (the request is used up either way).
  bool open(std::int64_t covered, std::int64_t n) {
    const bool keep = requested >= n && n > 0;
    requested = 0;
    first = keep ? covered : -1;
    tokens = keep ? n : 0;
    return keep;
  }
  // Whether `length` lies strictly inside the forward this window describes, the cache still
  // covering exactly what that forward left (`covered`).
  bool holds(std::int64_t covered, std::int64_t length) const {
    return first >= 0 && covered == first + tokens && length > first && length < covered;
  }
  // The index of the forward's token after which the cache covers `length`.
  std::int64_t row_for(std::int64_t length) const { return length - first - 1; }
  // Reserves `history` for a forward of `n` tokens over a conv tail shaped like `tail` (before
  // the forward, outside any step graph, so the forward's writes allocate nothing).
  bool reserve_history(const Tensor& tail, std::int64_t n) {
    return history.allocate(tail.memory(), {tail.rows() + n, tail.cols()});
  }
  // `tail` as it was after the forward's token j: rows [j+1, j+1+L) of `history`.
  void restore_tail(Tensor& tail, std::int64_t j) const {
    const auto row_bytes = static_cast<std::size_t>(tail.cols()) * sizeof(float);
    tail.memory()->copy(
        tail.raw(),
        static_cast<const char*>(history.raw()) + static_cast<std::size_t>(j + 1) * row_bytes,
        tail.bytes());
  }
  void clear() {
    first = -1;
    tokens = 0;
  }
};

}  // namespace fs

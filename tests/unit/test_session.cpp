// Warm sessions on the toy model: the radix tree, the RAM bank and its budget, restore points,
// the disk tier across restarts, and multi-turn conversations equal to recomputing from scratch.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "decode/generator.h"
#include "session/checkpoint.h"
#include "session/live_session.h"
#include "session/radix_tree.h"
#include "test_support.h"
#include "toy_model.h"

namespace fs {
namespace {

using test::ScratchDir;
using test::ToyModel;

std::vector<TokenId> seq(std::size_t n, std::uint32_t seed, std::int64_t vocab = 12) {
  std::vector<TokenId> v;
  std::mt19937 rng(seed);
  for (std::size_t i = 0; i < n; ++i)
    v.push_back(static_cast<TokenId>(rng() % static_cast<std::uint32_t>(vocab)));
  return v;
}

DecodeState cold(Model& model, std::span<const TokenId> tokens) {
  DecodeState s = new_decode_state(model);
  EXPECT_TRUE(extend(model, s, tokens).ok());
  return s;
}

void expect_same(const DecodeState& a, const DecodeState& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(max_difference(compare_states(*a.trunk, *b.trunk)), 0.0);
  EXPECT_EQ(max_difference(compare_states(*a.mtp_history, *b.mtp_history)), 0.0);
  EXPECT_EQ(a.next_logits, b.next_logits);
  EXPECT_EQ(a.last_hidden, b.last_hidden);
}

TEST(RadixTree, LongestPrefixMatchesBruteForce) {
  RadixTree tree;
  std::map<std::vector<TokenId>, RadixTree::EntryId> keys;
  std::mt19937 rng(3);
  for (RadixTree::EntryId id = 1; id <= 300; ++id) {
    std::vector<TokenId> k = seq(rng() % 12, static_cast<std::uint32_t>(rng() % 40), 3);
    tree.insert(k, id);
    keys[k] = id;
    if (id % 7 == 0) {  // erase a random existing key
      auto it = keys.begin();
      std::advance(it, static_cast<long>(rng() % keys.size()));
      EXPECT_TRUE(tree.erase(it->first));
      EXPECT_FALSE(tree.erase(it->first));
      keys.erase(it);
    }
  }
  EXPECT_EQ(tree.size(), keys.size());
  for (int q = 0; q < 500; ++q) {
    const auto query = seq(rng() % 14, static_cast<std::uint32_t>(rng() % 60), 3);
    std::optional<std::pair<std::size_t, RadixTree::EntryId>> best;
    for (const auto& [k, id] : keys) {
      if (k.size() <= query.size() && std::equal(k.begin(), k.end(), query.begin()) &&
          (!best || k.size() > best->first)) {
        best = {{k.size(), id}};
      }
    }
    const auto m = tree.longest_prefix(query);
    ASSERT_EQ(m.has_value(), best.has_value());
    if (m) {
      EXPECT_EQ(m->length, best->first);
      EXPECT_EQ(m->id, best->second);
    }
  }
}

TEST(SessionBank, LongestPrefixHitIsACopy) {
  ToyModel model;
  SessionBank bank;
  const auto tokens = seq(30, 1);
  ASSERT_TRUE(bank.put(cold(model, std::span(tokens).first(20))).ok());
  ASSERT_TRUE(bank.put(cold(model, tokens)).ok());
  auto longer = tokens;
  longer.push_back(5);
  auto hit = bank.lookup(longer);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->matched, 30u);
  // Mutating the restored copy leaves the banked state alone.
  ASSERT_TRUE(extend(model, hit->state, std::vector<TokenId>{5, 6, 7}).ok());
  auto again = bank.lookup(longer);
  ASSERT_TRUE(again);
  expect_same(again->state, cold(model, tokens));
  // A prompt that diverges at token 25 is served by the 20-token entry, never the 30-token one.
  auto diverged = tokens;
  diverged[25] = (diverged[25] + 1) % 12;
  auto partial = bank.lookup(diverged);
  ASSERT_TRUE(partial);
  EXPECT_EQ(partial->matched, 20u);
  EXPECT_FALSE(bank.lookup(std::vector<TokenId>{(tokens[0] + 1) % 12}));
  EXPECT_EQ(bank.stats().hits, 3);
  EXPECT_EQ(bank.stats().misses, 1);
}

TEST(SessionBank, BudgetEvictsLeastRecentlyUsed) {
  ToyModel model;
  const auto one = decode_state_bytes(cold(model, seq(40, 0)));
  SessionBank bank({.byte_budget = one * 3 + one / 2, .max_entries = 100});
  std::vector<std::vector<TokenId>> keys;
  std::vector<std::vector<TokenId>> evicted;
  bank.set_on_evict([&](const DecodeState& s) { evicted.push_back(s.tokens); });
  for (std::uint32_t i = 0; i < 3; ++i) {
    keys.push_back(seq(40, 100 + i));
    ASSERT_TRUE(bank.put(cold(model, keys.back())).ok());
  }
  ASSERT_TRUE(bank.lookup(keys[0]));  // key 0 is now the most recently used
  keys.push_back(seq(40, 200));
  ASSERT_TRUE(bank.put(cold(model, keys.back())).ok());
  EXPECT_LE(bank.bytes(), one * 3 + one / 2);
  EXPECT_EQ(bank.entries(), 3u);
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0], keys[1]);  // the least recently used
  EXPECT_FALSE(bank.lookup(keys[1]));
  EXPECT_TRUE(bank.lookup(keys[0]));
  // A state larger than the whole budget is refused, not banked.
  EXPECT_FALSE(bank.put(cold(model, seq(400, 9))).ok());
  EXPECT_EQ(bank.stats().oversize, 1);
}

TEST(SessionBank, RefusesIncompleteAndOldPolicyStates) {
  ToyModel model;
  SessionBank bank;
  DecodeState bad = cold(model, seq(5, 1));
  bad.tokens.push_back(3);
  EXPECT_FALSE(bank.put(bad).ok());
  const auto key = seq(8, 2);
  ASSERT_TRUE(bank.put(cold(model, key), kEnginePolicyVersion - 1).ok());
  EXPECT_FALSE(bank.lookup(key));
  EXPECT_EQ(bank.stats().policy_rejections, 1);
  EXPECT_EQ(bank.entries(), 0u);
}

TEST(LiveSession, RestorePointsServeDivergingPrompts) {
  ToyModel model;
  SessionBank bank;
  const SessionTiers tiers{&bank, nullptr};
  const auto prompt = seq(100, 4);
  auto p = prepare_session(
      model, tiers, prompt,
      {.prefill_chunk = 7, .restore_point_interval = 32, .persist_after_tokens = 0});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->tier, "cold");
  expect_same(p->state, cold(model, prompt));
  EXPECT_EQ(bank.entries(), 3u);  // points at 32, 64, 96
  // Diverge at token 70: the point at 64 serves; only 36 tokens are prefilled.
  auto other = prompt;
  other[70] = (other[70] + 1) % 12;
  const auto before = model.forwards;
  auto q = prepare_session(model, tiers, other, {.prefill_chunk = 64, .restore_point_interval = 0});
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->tier, "ram");
  EXPECT_EQ(q->reused_tokens, 64u);
  EXPECT_EQ(model.forwards - before, 1);
  expect_same(q->state, cold(model, other));
}

TEST(DiskStore, SurvivesRestartAndRejectsCorruptFiles) {
  ToyModel model;
  ScratchDir dir;
  const CheckpointIdentity id{Family::kQwenNext, "toy", 0, kEnginePolicyVersion};
  const auto a = seq(50, 5), b = seq(60, 6);
  {
    auto store =
        DiskStore::open({.dir = dir.path().string(), .byte_budget = 1 << 20, .identity = id});
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->persist(cold(model, a)).ok());
    ASSERT_TRUE((*store)->persist(cold(model, b)).ok());
    DecodeState incomplete = cold(model, seq(5, 1));
    incomplete.tokens.push_back(1);
    EXPECT_FALSE((*store)->persist(incomplete).ok());
    (*store)->flush();
    EXPECT_EQ((*store)->entries(), 2u);
  }
  test::write_text(dir.file("junk.fsck.123-4.partial"), "half a write");
  // Restart: a new store over the same folder.
  auto store =
      DiskStore::open({.dir = dir.path().string(), .byte_budget = 1 << 20, .identity = id});
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->entries(), 2u);
  EXPECT_FALSE(std::filesystem::exists(dir.file("junk.fsck.123-4.partial")));
  auto longer = a;
  longer.push_back(2);
  auto hit = (*store)->lookup(longer, model);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->matched, a.size());
  expect_same(hit->state, cold(model, a));

  // Corrupt b's file: refused, counted, removed; the caller recomputes cold.
  std::string b_path;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    if (e.path().string().ends_with("-60.fsck")) b_path = e.path().string();
  }
  ASSERT_FALSE(b_path.empty());
  auto bytes = test::read_bytes(b_path);
  bytes[bytes.size() / 2] ^= 0xff;  // inside the trunk tensors
  test::write_bytes(b_path, bytes);
  EXPECT_FALSE((*store)->lookup(b, model));
  EXPECT_EQ((*store)->stats().rejections.at("tensor_checksum"), 1);
  EXPECT_FALSE(std::filesystem::exists(b_path));

  // Another model's store refuses every file at open.
  auto other = DiskStore::open({.dir = dir.path().string(),
                                .identity = {Family::kQwenNext, "other", 0, kEnginePolicyVersion}});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->entries(), 0u);
}

// The disk tier compares keys, not lengths: a file replaced after it was indexed by another
// conversation's state of the same length is refused, never served for this prompt.
TEST(DiskStore, ComparesKeysNotLengths) {
  ToyModel model;
  ScratchDir dir;
  const CheckpointIdentity id{Family::kQwenNext, "toy", 0, kEnginePolicyVersion};
  const auto a = seq(40, 11), b = seq(40, 12);
  ASSERT_NE(a, b);
  auto store =
      DiskStore::open({.dir = dir.path().string(), .byte_budget = 1 << 20, .identity = id});
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->persist(cold(model, a)).ok());
  (*store)->flush();
  std::string path;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) path = e.path().string();
  ASSERT_TRUE(path.ends_with("-40.fsck")) << path;
  ASSERT_TRUE(save_checkpoint(path, cold(model, b), id).ok());  // same length, other tokens
  auto longer = a;
  longer.push_back(1);
  EXPECT_FALSE((*store)->lookup(longer, model));
  EXPECT_EQ((*store)->stats().rejections.at("key_coverage"), 1);
  EXPECT_FALSE(std::filesystem::exists(path));
}

// Two files holding the same key (a copy under another name): the store keeps one and deletes
// the other, so nothing stays on disk outside the index and the budget.
TEST(DiskStore, DuplicateKeysLeaveNoOrphanFiles) {
  ToyModel model;
  ScratchDir dir;
  const CheckpointIdentity id{Family::kQwenNext, "toy", 0, kEnginePolicyVersion};
  const auto a = seq(30, 21);
  {
    auto store =
        DiskStore::open({.dir = dir.path().string(), .byte_budget = 1 << 20, .identity = id});
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->persist(cold(model, a)).ok());
    (*store)->flush();
  }
  std::string path;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) path = e.path().string();
  std::filesystem::copy_file(path, dir.file("copy-of-a.fsck"));
  auto store =
      DiskStore::open({.dir = dir.path().string(), .byte_budget = 1 << 20, .identity = id});
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->entries(), 1u);
  std::size_t files = 0;
  std::uint64_t on_disk = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++files;
    on_disk += e.file_size();
  }
  EXPECT_EQ(files, 1u);
  EXPECT_EQ((*store)->bytes(), on_disk);
  auto hit = (*store)->lookup(a, model);
  ASSERT_TRUE(hit);
  expect_same(hit->state, cold(model, a));
}

TEST(DiskStore, StaysUnderItsBudget) {
  ToyModel model;
  ScratchDir dir;
  const CheckpointIdentity id{Family::kQwenNext, "toy", 0, kEnginePolicyVersion};
  auto store = DiskStore::open({.dir = dir.path().string(), .byte_budget = 40'000, .identity = id});
  ASSERT_TRUE(store.ok());
  for (std::uint32_t i = 0; i < 12; ++i) {
    ASSERT_TRUE((*store)->persist(cold(model, seq(100, 300 + i))).ok());
    (*store)->flush();
    std::uint64_t on_disk = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) on_disk += e.file_size();
    EXPECT_LE(on_disk, 40'000u);
  }
  EXPECT_GT((*store)->stats().evictions, 0);
  EXPECT_TRUE((*store)->lookup(seq(100, 311), model));  // the newest is kept
}

// A client resends the whole conversation each turn; the server should pay only for new tokens
// and produce exactly what recomputing from scratch produces.
std::vector<std::vector<TokenId>> run_conversation(ToyModel& model, const SessionTiers* tiers,
                                                   std::vector<std::string>* tier_log, int turns,
                                                   std::vector<TokenId>& conversation) {
  std::vector<std::vector<TokenId>> replies;
  for (int t = 0; t < turns; ++t) {
    const auto user = seq(9, 50 + static_cast<std::uint32_t>(t));
    conversation.insert(conversation.end(), user.begin(), user.end());
    DecodeState state;
    if (tiers) {
      auto p = prepare_session(model, *tiers, conversation,
                               {.prefill_chunk = 4, .restore_point_interval = 0});
      EXPECT_TRUE(p.ok());
      if (tier_log) tier_log->push_back(p->tier);
      state = std::move(p->state);
    } else {
      state = cold(model, conversation);
    }
    GenerateOptions opt;
    opt.max_tokens = 6;
    opt.mtp_depth = 2;
    opt.sampler.temperature = 0.7;
    opt.seed = 17 + static_cast<std::uint64_t>(t);
    const auto r = generate(model, state, opt);
    EXPECT_TRUE(r.state_complete);
    if (tiers) {
      EXPECT_TRUE(commit_session(*tiers, state, r.state_complete));
    }
    conversation.insert(conversation.end(), r.tokens.begin(), r.tokens.end());
    replies.push_back(r.tokens);
    EXPECT_EQ(state.tokens, conversation);
    EXPECT_EQ(state.next_logits, cold(model, conversation).next_logits);
  }
  return replies;
}

TEST(LiveSession, ThreeTurnsThroughTheBankAndTheDiskEqualRecomputing) {
  ToyModel model;
  std::vector<TokenId> scratch_conv;
  const auto expected = run_conversation(model, nullptr, nullptr, 3, scratch_conv);

  SessionBank bank;
  const SessionTiers ram_only{&bank, nullptr};
  std::vector<TokenId> conv;
  std::vector<std::string> tiers_seen;
  EXPECT_EQ(run_conversation(model, &ram_only, &tiers_seen, 3, conv), expected);
  EXPECT_EQ(tiers_seen, (std::vector<std::string>{"cold", "ram", "ram"}));

  // Through the disk, with a restart between every turn (a fresh bank each time).
  ScratchDir dir;
  const CheckpointIdentity id{Family::kQwenNext, "toy", 0, kEnginePolicyVersion};
  std::vector<TokenId> disk_conv;
  std::vector<std::vector<TokenId>> replies;
  tiers_seen.clear();
  for (int t = 0; t < 3; ++t) {
    auto store = DiskStore::open({.dir = dir.path().string(), .identity = id});
    ASSERT_TRUE(store.ok());
    SessionBank fresh;
    const SessionTiers tiers{&fresh, store->get()};
    std::vector<TokenId> conv_t = disk_conv;
    // One turn, continuing the conversation so far.
    auto turn_replies = [&] {
      const auto user = seq(9, 50 + static_cast<std::uint32_t>(t));
      conv_t.insert(conv_t.end(), user.begin(), user.end());
      auto p =
          prepare_session(model, tiers, conv_t, {.prefill_chunk = 4, .restore_point_interval = 0});
      EXPECT_TRUE(p.ok());
      tiers_seen.push_back(p->tier);
      GenerateOptions opt;
      opt.max_tokens = 6;
      opt.mtp_depth = 2;
      opt.sampler.temperature = 0.7;
      opt.seed = 17 + static_cast<std::uint64_t>(t);
      const auto r = generate(model, p->state, opt);
      EXPECT_TRUE(commit_session(tiers, p->state, r.state_complete));
      conv_t.insert(conv_t.end(), r.tokens.begin(), r.tokens.end());
      return r.tokens;
    };
    replies.push_back(turn_replies());
    persist_all_to_disk(tiers);  // clean shutdown
    disk_conv = conv_t;
  }
  EXPECT_EQ(replies, expected);
  EXPECT_EQ(disk_conv, scratch_conv);
  EXPECT_EQ(tiers_seen, (std::vector<std::string>{"cold", "disk", "disk"}));
}

TEST(LiveSession, LongGenerationsPersistAtAlignedFrontiers) {
  ToyModel model;
  ScratchDir dir;
  const CheckpointIdentity id{Family::kQwenNext, "toy", 0, kEnginePolicyVersion};
  auto store = DiskStore::open({.dir = dir.path().string(), .identity = id});
  ASSERT_TRUE(store.ok());
  SessionBank bank;
  const SessionTiers tiers{&bank, store->get()};
  const auto prompt = seq(10, 8);
  auto p = prepare_session(model, tiers, prompt, {.persist_after_tokens = 1 << 20});
  ASSERT_TRUE(p.ok());
  GenerateOptions opt;
  opt.max_tokens = 70;
  opt.mtp_depth = 3;
  opt.on_commit = persist_at_frontiers(tiers, 16, static_cast<std::int64_t>(prompt.size()));
  const auto r = generate(model, p->state, opt);
  ASSERT_TRUE(r.state_complete);
  (*store)->flush();
  // 10 + 70 tokens cross 16, 32, 48, 64 (and 80 when a round, not the final commit, reaches it):
  // one checkpoint each, just past the frontier, each the exact cold state of its key.
  EXPECT_GE((*store)->entries(), 4u);
  EXPECT_LE((*store)->entries(), 5u);
  EXPECT_EQ((*store)->stats().writes, static_cast<std::int64_t>((*store)->entries()));
  for (std::size_t frontier : {16u, 32u, 48u, 64u}) {
    const std::span<const TokenId> query(p->state.tokens.data(), frontier + kMaxMtpDepth + 1);
    auto hit = (*store)->lookup(query, model);
    ASSERT_TRUE(hit) << frontier;
    EXPECT_GE(hit->matched, frontier);
    EXPECT_LT(hit->matched, frontier + kMaxMtpDepth + 2);
    expect_same(hit->state, cold(model, std::span(p->state.tokens).first(hit->matched)));
  }
}

}  // namespace
}  // namespace fs

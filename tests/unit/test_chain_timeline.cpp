// The chain timeline's host analysis (bench/chain_timeline.h) on made-up block waits: how a
// step's records split into launches, how the launch log names them, how steps average. The
// trace itself runs on a GPU (`flashserve bench --timeline`, bench/NOTES.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "bench/chain_timeline.h"

namespace fs::bench {
namespace {

using fs::cuda::ChainLaunch;
using fs::cuda::ChainTraceRecord;

// The waits of one launch: block b arrives at arrive[b] ns and is released at
// max(arrive[b], inputs) + 10 ns.
void add_launch(std::vector<ChainTraceRecord>& out, std::uint32_t threads,
                const std::vector<std::uint64_t>& arrive, std::uint64_t inputs) {
  for (std::size_t b = 0; b < arrive.size(); ++b) {
    ChainTraceRecord r;
    r.arrive = arrive[b];
    r.release = std::max(arrive[b], inputs) + 10;
    r.block = static_cast<std::uint32_t>(b);
    r.blocks = static_cast<std::uint32_t>(arrive.size());
    r.threads = threads;
    out.push_back(r);
  }
}

// A (4 blocks, all resident 2 us before their inputs at 10 us), B (3 blocks, one starting 1.5 us
// after its inputs at 15 us), A's grid again (released at 20 us), all shuffled.
std::vector<ChainTraceRecord> three_launches() {
  std::vector<ChainTraceRecord> r;
  add_launch(r, 256, {8000, 8000, 8100, 8200}, 10000);
  add_launch(r, 128, {11000, 11000, 16500}, 15000);
  add_launch(r, 256, {17000, 17100, 17200, 17300}, 20000);
  std::shuffle(r.begin(), r.end(), std::mt19937(3));
  return r;
}

TEST(ChainTimeline, SplitsAStepIntoItsLaunchesInReleaseOrder) {
  const auto l = split_launches(three_launches());
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0].blocks, 4u);
  EXPECT_EQ(l[1].blocks, 3u);
  EXPECT_EQ(l[2].blocks, 4u);  // the same grid again is a launch of its own
  for (const auto& x : l) EXPECT_EQ(x.waits, x.blocks);
  // Releases from the step's first (10.01 us), holds as the next release less this one.
  EXPECT_DOUBLE_EQ(l[0].release, 0.0);
  EXPECT_DOUBLE_EQ(l[1].release, 5.0);
  EXPECT_DOUBLE_EQ(l[2].release, 10.0);
  EXPECT_DOUBLE_EQ(l[0].hold, 5.0);
  EXPECT_DOUBLE_EQ(l[1].hold, 5.0);
  EXPECT_DOUBLE_EQ(l[2].hold, 0.0);  // the last launch's end is not seen
  // All of A early; two of B's three, its last block 1.49 us after the first release.
  EXPECT_DOUBLE_EQ(l[0].early, 1.0);
  EXPECT_NEAR(l[1].early, 2.0 / 3.0, 1e-12);
  EXPECT_NEAR(l[1].last_arrival, 1.49, 1e-9);
  EXPECT_NEAR(l[1].release_spread, 1.5, 1e-9);
  EXPECT_LT(l[0].last_arrival, 0.0);
}

TEST(ChainTimeline, ALateThreadZeroDoesNotSplitItsLaunch) {
  // Launch n's block 1 records its arrival (thread 0) after launch n + 1's first block arrived:
  // the other warps of block 1 had released n + 1 already. Its release still precedes n + 1's.
  std::vector<ChainTraceRecord> r;
  add_launch(r, 256, {1000, 3100, 1200}, 3000);  // released 3010, 3110, 3010
  add_launch(r, 128, {3050, 3060}, 5000);        // arrives before block 1 of the first
  const auto l = split_launches(r);
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0].waits, 3u);
  EXPECT_EQ(l[1].waits, 2u);
  EXPECT_DOUBLE_EQ(l[0].hold, 2.0);
}

TEST(ChainTimeline, ABlockArrivingAfterItsInputsIsNotEarly) {
  std::vector<ChainTraceRecord> r;
  add_launch(r, 256, {5000, 5000}, 5000);  // nothing waited: arrive == release - 10 ns
  const auto l = split_launches(r);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_DOUBLE_EQ(l[0].early, 0.0);
}

TEST(ChainTimeline, ASecondWaitOfABlockIsNotANewLaunch) {
  std::vector<ChainTraceRecord> r;
  add_launch(r, 256, {1000, 1100, 2100}, 2000);  // block 2 arrives late, released at 2110
  auto again = r[1];  // block 1 waits a second time, before block 2's wait returned
  again.arrive = 2015;
  again.release = 2020;
  r.push_back(again);
  add_launch(r, 64, {2100}, 3000);
  const auto l = split_launches(r);
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0].waits, 3u);
  EXPECT_EQ(l[1].blocks, 1u);
}

TEST(ChainTimeline, NamesLaunchesFromTheLatestRecordingInTheLog) {
  auto step = split_launches(three_launches());
  // An older recording of other grids, then the step's: A, an unlogged-on-device kernel, B, A.
  const std::vector<ChainLaunch> log = {
      {"void fs::cuda::old_kernel<1>(int)", 4, 256},
      {"void fs::cuda::other(float)", 3, 128},
      {"void fs::cuda::(anonymous namespace)::a_kernel<float, 2>(const float*)", 4, 256},
      {"void fs::cuda::skipped_kernel()", 7, 32},
      {"void fs::cuda::(anonymous namespace)::b_kernel(float*)", 3, 128},
      {"void fs::cuda::(anonymous namespace)::a_kernel<float, 2>(const float*)", 4, 256}};
  name_launches(step, log);
  ASSERT_EQ(step.size(), 3u);
  EXPECT_EQ(short_kernel_name(step[0].kernel), "a_kernel");
  EXPECT_EQ(short_kernel_name(step[1].kernel), "b_kernel");
  EXPECT_EQ(short_kernel_name(step[2].kernel), "a_kernel");
  // A grid the log never had stays unnamed.
  std::vector<ChainTraceRecord> r;
  add_launch(r, 96, {100}, 200);
  auto odd = split_launches(r);
  name_launches(odd, log);
  EXPECT_TRUE(odd[0].kernel.empty());
}

TEST(ChainTimeline, AveragesTheStepsOfTheCommonShape) {
  auto a = split_launches(three_launches());
  auto b = a;
  for (auto& l : b) l.hold *= 3;  // 15, 15, 0
  std::vector<ChainTraceRecord> r;
  add_launch(r, 32, {0}, 0);
  const auto other = split_launches(r);
  const auto avg = average_steps({a, other, b});
  EXPECT_EQ(avg.steps, 3u);
  EXPECT_EQ(avg.used, 2u);
  ASSERT_EQ(avg.launches.size(), 3u);
  EXPECT_DOUBLE_EQ(avg.launches[0].hold, 10.0);
  EXPECT_DOUBLE_EQ(avg.launches[1].hold, 10.0);
}

TEST(ChainTimeline, ShortNames) {
  EXPECT_EQ(short_kernel_name("void fs::cuda::(anonymous namespace)::hc_parts_kernel<float, 1, 3, "
                              "2>(const float*, long)"),
            "hc_parts_kernel");
  EXPECT_EQ(short_kernel_name("plain_kernel"), "plain_kernel");
  EXPECT_EQ(short_kernel_name("void ns::k(int)"), "k");
}

}  // namespace
}  // namespace fs::bench

// The decode step's kernel chain as it ran (`flashserve bench --timeline`): the chain trace's
// block waits (backend/cuda/chain_trace.h) of one step split into its launches, named from the
// launch log, and several steps averaged. Pure host code, so the CPU tests check it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/chain_trace.h"

namespace fs::bench {

// One launch of a step. Times in microseconds from the step's first release.
struct TimelineLaunch {
  std::string kernel;  // from the launch log ("" where it could not be named)
  std::uint32_t blocks = 0;
  std::uint32_t threads = 0;
  std::size_t waits = 0;  // its blocks' records (blocks that returned before waiting have none)
  double release = 0;     // the first of its blocks' waits to return: its inputs complete
  // The next launch's release less this one's: how long this launch held the chain (0 for a
  // step's last launch, whose end no wait records).
  double hold = 0;
  double early = 0;           // the fraction of its blocks resident before its inputs were
  double last_arrival = 0;    // its last block's arrival less its release (<= 0: all early)
  double release_spread = 0;  // its last block's release less its first
};

// Splits one step's records into launches: records in release order, a new launch where the grid
// (blocks, threads) changes or a grid whose blocks have all been seen sees a block again (a block
// seen again before that is a second wait of one block, dropped). A launch's waits return only
// once the launch before it has finished, after every wait of that one returned, so a launch's
// records are contiguous in release order (not in arrival order: thread 0 of a block may reach
// its wait after the block's other warps have released the next launch). Launches of one grid
// back to back whose earlier launch lost blocks (returned before waiting) merge: the count of
// waits says so.
std::vector<TimelineLaunch> split_launches(std::vector<fs::cuda::ChainTraceRecord> records);

// Names the launches from the log: the step's grids are looked for in the log as a run (a step
// graph's recording logs its launches in the order they run), the latest run of the step's
// first launches, then each launch takes the next logged launch of its grid within a few
// (kernels launched without launch_overlapped are not logged and stay unnamed).
void name_launches(std::vector<TimelineLaunch>& step,
                   const std::vector<fs::cuda::ChainLaunch>& log);

// The steps that share the most common shape (the same grids in the same order), averaged field
// by field; `used` says how many.
struct StepAverage {
  std::vector<TimelineLaunch> launches;
  std::size_t used = 0;
  std::size_t steps = 0;
};
StepAverage average_steps(const std::vector<std::vector<TimelineLaunch>>& steps);

// "hc_parts_kernel" of "void fs::cuda::(anonymous namespace)::hc_parts_kernel<...>(...)".
std::string short_kernel_name(const std::string& demangled);

}  // namespace fs::bench

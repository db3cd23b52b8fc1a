// The overlapped chain's timeline (`flashserve bench --timeline`; docs/GPU.md step 27).
//
// A decode step is a chain of overlapped kernels (cuda_common.h): each is launched while the one
// before it runs, and its blocks wait in `wait_for_inputs` until that one has finished. While a
// trace is on, thread 0 of every block that waits writes when it reached the wait (arrive) and
// when the wait returned (release), so the host can tell, for every kernel of the real chain, when
// its inputs were complete (the first release: the kernel before it finished), how long it held
// the chain (the next kernel's first release less its own), and how many of its blocks were
// resident before its inputs were (arrive before release) or started only after (the
// multiprocessors were still full). ncu times a kernel alone, `bench --marginal` an op's share
// by its absence; this is the chain as it runs, graphs and overlap included.
//
// Built only with the CMake option FLASHSERVE_CHAIN_TRACE (off by default: without it the wait is
// the bare instruction and chain_trace_begin says how to get it). Built in and off, the cost is
// one constant-memory read and a branch a thread at each wait. On, each block's
// thread 0 takes a slot with an atomic before its wait (where it waits anyway; a block that
// arrives after its inputs are complete pays that round trip) and stores 32 bytes after it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace fs::cuda {

// One block's wait, written by its thread 0.
struct ChainTraceRecord {
  std::uint64_t arrive = 0;   // %globaltimer, ns, as the block reached its wait
  std::uint64_t release = 0;  // as the wait returned
  std::uint32_t block = 0;    // the block's linear index in its grid
  std::uint32_t blocks = 0;   // the grid's blocks
  std::uint32_t threads = 0;  // a block's threads
  std::uint32_t sm = 0;       // the multiprocessor it ran on
};

struct ChainTrace {
  std::vector<ChainTraceRecord> records;  // in the order the slots were taken
  std::uint64_t waits = 0;                // block waits seen (past the capacity, not kept)
};

// Starts a trace of at most `capacity` block waits in every kernel of the process (each
// translation unit's kernels read their own copy of the switch; all are set). Fails without a
// GPU or when a trace is already on.
Status chain_trace_begin(std::size_t capacity);
// Whether the kernels were built with the trace (FLASHSERVE_CHAIN_TRACE).
bool chain_trace_built();
// Waits for the device, turns the trace off and returns what it recorded.
Expected<ChainTrace> chain_trace_end();

// A kernel launch as the host asked for it (launch_overlapped, while the log is on): a step
// graph's recording logs the step's launches in their order, which names the trace's kernels.
struct ChainLaunch {
  std::string kernel;  // demangled
  std::uint32_t blocks = 0;
  std::uint32_t threads = 0;
};
// Logged from when it is turned on (a step graph records its launches once, at its first step, so
// `bench --timeline` turns the log on before anything runs).
void set_chain_launch_log(bool on);
bool chain_launch_logging();
void log_chain_launch(const void* kernel, std::uint32_t blocks, std::uint32_t threads);
// The launches logged from the `from`-th on, in order (the log is kept), and how many there are.
// Decode steps launched one kernel at a time (step graphs off, the default) log every step, so
// a step's own launches are those between two counts.
std::vector<ChainLaunch> chain_launches(std::size_t from = 0);
std::size_t chain_launch_count();

}  // namespace fs::cuda

#include "bench/chain_timeline.h"

#include <algorithm>
#include <limits>
#include <map>
#include <unordered_set>

namespace fs::bench {
namespace {

using fs::cuda::ChainLaunch;
using fs::cuda::ChainTraceRecord;

constexpr double kNsPerUs = 1e3;
// A block is early (resident before its inputs were complete) if it reached its wait at least this
// long before the launch's first release: a block that arrives after it still spends tens of ns
// between its two timer reads (the slot's atomic issued, a wait that returns at once).
constexpr std::uint64_t kEarlyNs = 250;

// Launches of one grid are merged only where a block repeats after the whole grid was seen.
struct Building {
  std::uint32_t blocks = 0, threads = 0;
  std::unordered_set<std::uint32_t> seen;
  std::vector<const ChainTraceRecord*> records;
};

// Logged launches of a grid within this many of the last one matched: the unlogged kernels between
// two logged ones (the ordinary launches) are few.
constexpr std::size_t kNameLookahead = 8;
// The step's first launches that fix where in the log the step was recorded.
constexpr std::size_t kAnchorLaunches = 16;

}  // namespace

std::vector<TimelineLaunch> split_launches(std::vector<ChainTraceRecord> records) {
  std::stable_sort(records.begin(), records.end(),
                   [](const auto& a, const auto& b) { return a.release < b.release; });
  std::vector<Building> built;
  for (const auto& r : records) {
    const bool new_launch =
        built.empty() || built.back().blocks != r.blocks || built.back().threads != r.threads ||
        (built.back().seen.size() >= r.blocks && built.back().seen.count(r.block));
    if (new_launch) {
      built.emplace_back();
      built.back().blocks = r.blocks;
      built.back().threads = r.threads;
    }
    auto& b = built.back();
    if (!b.seen.insert(r.block).second) continue;  // a second wait of one block
    b.records.push_back(&r);
  }
  std::vector<TimelineLaunch> out;
  if (built.empty()) return out;
  std::uint64_t origin = std::numeric_limits<std::uint64_t>::max();
  for (const auto& b : built)
    for (const auto* r : b.records) origin = std::min(origin, r->release);
  for (const auto& b : built) {
    TimelineLaunch l;
    l.blocks = b.blocks;
    l.threads = b.threads;
    l.waits = b.records.size();
    std::uint64_t first = std::numeric_limits<std::uint64_t>::max(), last = 0, arrival = 0;
    for (const auto* r : b.records) {
      first = std::min(first, r->release);
      last = std::max(last, r->release);
      arrival = std::max(arrival, r->arrive);
    }
    std::size_t early = 0;
    for (const auto* r : b.records) early += r->arrive + kEarlyNs <= first ? 1 : 0;
    l.release = static_cast<double>(first - origin) / kNsPerUs;
    l.early = static_cast<double>(early) / static_cast<double>(b.records.size());
    l.last_arrival = (static_cast<double>(arrival) - static_cast<double>(first)) / kNsPerUs;
    l.release_spread = static_cast<double>(last - first) / kNsPerUs;
    out.push_back(l);
  }
  for (std::size_t i = 0; i + 1 < out.size(); ++i)
    out[i].hold = out[i + 1].release - out[i].release;
  return out;
}

void name_launches(std::vector<TimelineLaunch>& step, const std::vector<ChainLaunch>& log) {
  if (step.empty() || log.empty()) return;
  const auto matches = [&](std::size_t at, std::size_t i) {
    return log[at].blocks == step[i].blocks && log[at].threads == step[i].threads;
  };
  // The latest place in the log where the step's first launches appear in order (gaps of unlogged
  // kernels allowed as when naming).
  const std::size_t anchor = std::min(step.size(), kAnchorLaunches);
  std::size_t start = log.size();
  for (std::size_t s = log.size(); s-- > 0;) {
    if (!matches(s, 0)) continue;
    std::size_t at = s, found = 1;
    for (std::size_t i = 1; i < anchor; ++i) {
      std::size_t k = at + 1;
      while (k < log.size() && k <= at + kNameLookahead && !matches(k, i)) ++k;
      if (k >= log.size() || k > at + kNameLookahead) continue;  // unlogged: skip this launch
      at = k;
      ++found;
    }
    if (found * 2 > anchor) {
      start = s;
      break;
    }
  }
  if (start == log.size()) return;
  std::size_t next = start;
  for (std::size_t i = 0; i < step.size() && next < log.size(); ++i) {
    for (std::size_t k = next; k < log.size() && k < next + kNameLookahead; ++k) {
      if (!matches(k, i)) continue;
      step[i].kernel = log[k].kernel;
      next = k + 1;
      break;
    }
  }
}

StepAverage average_steps(const std::vector<std::vector<TimelineLaunch>>& steps) {
  StepAverage out;
  out.steps = steps.size();
  // The most common shape: the grid sequence.
  std::map<std::vector<std::pair<std::uint32_t, std::uint32_t>>, std::size_t> shapes;
  const auto shape_of = [](const std::vector<TimelineLaunch>& s) {
    std::vector<std::pair<std::uint32_t, std::uint32_t>> v;
    v.reserve(s.size());
    for (const auto& l : s) v.emplace_back(l.blocks, l.threads);
    return v;
  };
  for (const auto& s : steps)
    if (!s.empty()) ++shapes[shape_of(s)];
  if (shapes.empty()) return out;
  const auto best =
      std::max_element(shapes.begin(), shapes.end(), [](const auto& a, const auto& b) {
        return a.second < b.second;
      })->first;
  for (const auto& s : steps) {
    if (s.empty() || shape_of(s) != best) continue;
    if (out.used == 0) {
      out.launches = s;
    } else {
      for (std::size_t i = 0; i < s.size(); ++i) {
        auto& a = out.launches[i];
        const auto& l = s[i];
        if (a.kernel.empty()) a.kernel = l.kernel;
        a.waits += l.waits;
        a.release += l.release;
        a.hold += l.hold;
        a.early += l.early;
        a.last_arrival += l.last_arrival;
        a.release_spread += l.release_spread;
      }
    }
    ++out.used;
  }
  const auto n = static_cast<double>(out.used);
  for (auto& a : out.launches) {
    a.waits = static_cast<std::size_t>(static_cast<double>(a.waits) / n + 0.5);
    a.release /= n;
    a.hold /= n;
    a.early /= n;
    a.last_arrival /= n;
    a.release_spread /= n;
  }
  return out;
}

std::string short_kernel_name(const std::string& demangled) {
  // The name before the template arguments or the parameter list, after the last "::".
  std::string name = demangled;
  for (const std::string anon = "(anonymous namespace)::";;) {
    const auto at = name.find(anon);
    if (at == std::string::npos) break;
    name.erase(at, anon.size());
  }
  std::size_t end = name.find_first_of("<(");
  if (end == std::string::npos) end = name.size();
  std::string head = name.substr(0, end);
  if (const auto colon = head.rfind("::"); colon != std::string::npos)
    head = head.substr(colon + 2);
  if (const auto space = head.rfind(' '); space != std::string::npos) head = head.substr(space + 1);
  return head;
}

}  // namespace fs::bench

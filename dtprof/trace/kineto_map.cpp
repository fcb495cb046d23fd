// What dtprof/trace/kineto_map.py derives from the scanned GPU events, launches, CPU events and
// memory readings, worked out after the scan by the same rules (see Mapped): the GPU events'
// stamps, categories and launches, the steps, and the samples. The collectives are
// kineto_collectives.cpp's.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kineto_scan.h"

namespace dtprof_kineto {
namespace {

// The N of a ProfilerStep#N name (is_step's rule: the digits after '#'): false where they are
// past int64 (Python then refuses the file).
bool step_number(std::string_view n, int64_t& out) {
  const size_t at = n.find('#');
  size_t i = at + 1;
  while (i < n.size() && (n[i] == ' ' || (n[i] >= '\t' && n[i] <= '\r'))) ++i;
  size_t end = i;
  while (end < n.size() && n[end] >= '0' && n[end] <= '9') ++end;
  auto done = std::from_chars(n.data() + i, n.data() + end, out);
  return done.ec == std::errc() && done.ptr == n.data() + end;
}

// kineto.ns_from_us for one stamp: false when past int64 ns (year 2261), or NaN. The same
// float operations as numpy's (floor; rint, which rounds half to even, as nearbyint does).
bool ns_from_us(double us, int64_t& out) {
  if (!(std::fabs(us) < 9.2e15)) return false;
  const double whole = std::floor(us);
  const double fraction_ns = std::nearbyint((us - whole) * 1000.0);
  out = static_cast<int64_t>(whole) * 1000 + static_cast<int64_t>(fraction_ns);
  return true;
}

// kineto_map.kernel_category for one name (a null name: compute): the rules in that order,
// later ones winning. "^nccl.*Kernel": "Kernel" after "nccl" with no line break between.
Category name_category(std::string_view n) {
  Category out = Category::kCompute;
  if (n.find("Memcpy") != n.npos || n.find("Sync") != n.npos) out = Category::kOther;
  if (starts(n, "Memcpy") || starts(n, "Memset") || starts(n, "dma")) out = Category::kMemory;
  if (starts(n, "nccl")) {
    std::string_view rest = n.substr(4);
    rest = rest.substr(0, rest.find('\n'));
    if (rest.find("Kernel") != rest.npos) out = Category::kCommunication;
  }
  return out;
}

bool memory_category(std::string_view c) {
  return is(c, "gpu_memcpy") || is(c, "gpu_memset") || is(c, "Memcpy") || is(c, "Memset");
}

// kineto_native.read's stamps of a group: each event's start and end (start + its duration,
// none below 0) in ns. False where one is out of range.
bool group_ns(const Group& g, std::vector<int64_t>& ts_ns, std::vector<int64_t>& end_ns) {
  const size_t n = g.ts.size();
  ts_ns.resize(n);
  end_ns.resize(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t dur;
    if (!ns_from_us(g.ts[i], ts_ns[i]) || !ns_from_us(g.dur[i], dur)) return false;
    end_ns[i] = ts_ns[i] + std::max<int64_t>(dur, 0);
  }
  return true;
}

}  // namespace

// kineto_native.read's stamps and kineto_map's kernel_category and gpu_launches, for the GPU
// events (see Mapped).
void map_gpu(const Columns& c, Mapped& m) {
  const Group& g = c.gpu;
  const size_t n = g.ts.size();
  if (!group_ns(g, m.gpu_ts_ns, m.gpu_end_ns)) return;
  m.launch_ts_ns.resize(c.launch_ts.size());
  for (size_t i = 0; i < c.launch_ts.size(); ++i)
    if (!ns_from_us(c.launch_ts[i], m.launch_ts_ns[i])) return;

  std::unordered_map<std::string_view, Category> by_name;  // a trace repeats few names
  m.gpu_category.resize(n);
  for (size_t i = 0; i < n; ++i) {
    Category category = Category::kCompute;
    if (g.name.valid[i]) {
      std::string_view name = view(g.name, i);
      auto found = by_name.find(name);
      category = found != by_name.end() ? found->second : by_name[name] = name_category(name);
    }
    const bool memory = g.cat.valid[i] && memory_category(view(g.cat, i));
    if (memory && category != Category::kCommunication) category = Category::kMemory;
    m.gpu_category[i] = static_cast<int64_t>(category);
  }

  // the launches that have a correlation id, by it (ties in file order), searched for each
  // GPU event's: where none has it, the nearest one's thread, as numpy's searchsorted gives
  std::vector<size_t> order;
  for (size_t k = 0; k < c.launch_correlation.size(); ++k)
    if (c.launch_correlation[k] >= 0) order.push_back(k);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return c.launch_correlation[a] < c.launch_correlation[b];
  });
  m.launch_found.assign(n, 0);
  m.launch_at_ns.assign(n, 0);
  m.launch_at_tid.assign(n, -1);
  if (!order.empty()) {
    for (size_t i = 0; i < n; ++i) {
      const int64_t want = c.gpu_correlation[i];
      auto at = std::lower_bound(order.begin(), order.end(), want, [&](size_t k, int64_t v) {
        return c.launch_correlation[k] < v;
      });
      if (at == order.end()) --at;
      const size_t k = *at;
      m.launch_found[i] = c.launch_correlation[k] == want;
      m.launch_at_ns[i] = m.launch_found[i] ? m.launch_ts_ns[k] : 0;
      m.launch_at_tid[i] = c.launch_tid[k];
    }
  }
  m.done = true;
}

// kineto_map._steps: each ProfilerStep#N from the first start to the last end of its
// annotations, in order of start (ties by N). False where a stamp or an N is out of range.
bool map_steps(const Columns& c, Mapped& m) {
  const Group& g = c.cpu;
  const size_t n = g.ts.size();
  if (!group_ns(g, m.cpu_ts_ns, m.cpu_end_ns)) return false;
  std::vector<std::pair<int64_t, size_t>> found;  // (N, event)
  for (size_t i = 0; i < n; ++i) {
    if (!g.name.valid[i] || !is_step(view(g.name, i))) continue;
    int64_t number;
    if (!step_number(view(g.name, i), number)) return false;
    found.emplace_back(number, i);
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t k = 0; k < found.size(); ++k) {
    const size_t i = found[k].second;
    if (k == 0 || found[k].first != found[k - 1].first) {
      m.step_number.push_back(found[k].first);
      m.step_start_ns.push_back(m.cpu_ts_ns[i]);
      m.step_end_ns.push_back(m.cpu_end_ns[i]);
    } else {
      m.step_start_ns.back() = std::min(m.step_start_ns.back(), m.cpu_ts_ns[i]);
      m.step_end_ns.back() = std::max(m.step_end_ns.back(), m.cpu_end_ns[i]);
    }
  }
  const std::vector<size_t> by_start = stable_order(m.step_number.size(), [&](size_t a, size_t b) {
    return m.step_start_ns[a] < m.step_start_ns[b];
  });
  auto reorder = [&](std::vector<int64_t>& v) {
    std::vector<int64_t> out(v.size());
    for (size_t k = 0; k < v.size(); ++k) out[k] = v[by_start[k]];
    v.swap(out);
  };
  reorder(m.step_number);
  reorder(m.step_start_ns);
  reorder(m.step_end_ns);
  return true;
}

// kineto_map.step_at: the step that began last at or before t; -1 before the first step.
int64_t step_at(const Mapped& m, int64_t t) {
  auto after = std::upper_bound(m.step_start_ns.begin(), m.step_start_ns.end(), t);
  return after == m.step_start_ns.begin() ? -1 : m.step_number[after - m.step_start_ns.begin() - 1];
}

// kineto_map.samples_table: per (step, device), in that order (CPU before CUDA), allocated
// then reserved, the last reading that has the value (readings in time order, ties in file
// order), stamped with the group's last time. False where a stamp is out of range.
bool map_samples(const Columns& c, Mapped& m) {
  const size_t n = c.memory_ts.size();
  std::vector<int64_t> ts(n), key(n);
  for (size_t i = 0; i < n; ++i) {
    if (!ns_from_us(c.memory_ts[i], ts[i])) return false;
    key[i] = step_at(m, ts[i]) * 2 + (c.memory_device_type[i] == 1 ? 1 : 0);
  }
  // by group, each group in time order
  std::vector<size_t> order = stable_order(n, [&](size_t a, size_t b) { return ts[a] < ts[b]; });
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key[a] < key[b]; });
  for (int metric = 0; metric < 2; ++metric) {
    const std::vector<double>& values = metric == 0 ? c.memory_allocated : c.memory_reserved;
    for (size_t lo = 0, hi; lo < n; lo = hi) {
      const int64_t group = key[order[lo]];
      for (hi = lo; hi < n && key[order[hi]] == group; ++hi) {
      }
      for (size_t k = hi; k-- > lo;) {  // the group's last reading that has the value
        const double value = values[order[k]];
        if (std::isnan(value)) continue;
        const int64_t device = ((group % 2) + 2) % 2;
        m.sample_step.push_back((group - device) / 2);
        m.sample_ts_ns.push_back(ts[order[hi - 1]]);
        m.sample_metric.push_back(metric * 2 + device);
        m.sample_value.push_back(value);
        break;
      }
    }
  }
  return true;
}

}  // namespace dtprof_kineto

// kineto_map.collectives_table worked out after the scan, by the same rules (see Mapped): each
// collective's args read (kineto_comm_args.cpp), its operation and size named as the mapping
// names them, its times those of the communication kernels it launched.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kineto_scan.h"

namespace dtprof_kineto {
namespace {

// kineto_map.OP_NAMES, DTYPE_BYTES and P2P_OPS (tests/test_kineto_native.py checks that
// they agree).
const std::unordered_map<std::string_view, std::string_view> kOpNames = {
    {"allreduce", "all_reduce"},
    {"allreduce_coalesced", "all_reduce_coalesced"},
    {"allgather", "all_gather"},
    {"_allgather_base", "all_gather_into_tensor"},
    {"allgather_into_tensor", "all_gather_into_tensor"},
    {"allgather_into_tensor_coalesced", "all_gather_into_tensor_coalesced"},
    {"reducescatter", "reduce_scatter"},
    {"_reduce_scatter_base", "reduce_scatter_tensor"},
    {"reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_coalesced"},
    {"alltoall", "all_to_all"},
    {"alltoall_base", "all_to_all_single"},
    {"all_to_allv", "all_to_all_single"},
    {"recvanysource", "recv"},
};
const std::unordered_map<std::string_view, int64_t> kDtypeBytes = {
    {"float", 4}, {"float32", 4}, {"double", 8}, {"float64", 8}, {"half", 2}, {"float16", 2},
    {"c10::half", 2}, {"bfloat16", 2}, {"c10::bfloat16", 2}, {"int", 4}, {"int32", 4},
    {"long", 8}, {"int64", 8}, {"long int", 8}, {"short", 2}, {"int16", 2}, {"char", 1},
    {"signed char", 1}, {"unsigned char", 1}, {"byte", 1}, {"int8", 1}, {"uint8", 1},
    {"bool", 1},
};
bool is_p2p(std::string_view op) {
  return op == "send" || op == "recv" || op == "isend" || op == "irecv" || op == "recvanysource";
}

// s.lower() for ASCII text: false for any other (Python lowers the rest of Unicode too).
bool ascii_lower(std::string_view s, std::string& out) {
  out.assign(s);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return true;
}

// kineto_map._normal_op: after the first ':', stripped of what Python's str.strip() strips
// (ASCII: \t..\r, \x1c..\x1f, space) and lowered; false for non-ASCII names.
bool normal_op(std::string_view name, std::string& out) {
  const size_t colon = name.find(':');
  if (colon != name.npos) name = name.substr(colon + 1);
  auto space = [](char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
  };
  while (!name.empty() && space(name.front())) name.remove_prefix(1);
  while (!name.empty() && space(name.back())) name.remove_suffix(1);
  if (!ascii_lower(name, out)) return false;
  auto found = kOpNames.find(out);
  if (found != kOpNames.end()) out.assign(found->second);
  return true;
}

// kineto_map._size: (bytes, dtype) from "In msg nelems" and "dtype", else from the first
// input's dims and type. False where it cannot follow Python (non-ASCII, a product past int64).
bool comm_size(const CommArgs& a, int64_t& bytes, std::string& dtype, bool& has_dtype) {
  bytes = 0;
  has_dtype = false;
  std::string lower;
  auto per = [](const std::string& t) {
    auto found = kDtypeBytes.find(t);
    return found != kDtypeBytes.end() ? found->second : int64_t{0};
  };
  if (a.nelems == CommArgs::kValue && a.dtype == CommArgs::kValue) {
    if (!ascii_lower(a.dtype_s, lower)) return false;
    if (__builtin_mul_overflow(a.nelems_i, per(lower), &bytes)) return false;
    dtype = lower;
    has_dtype = true;
    return true;
  }
  if (!a.dims || !a.types) return true;
  if (a.dims_count != CommArgs::kValue || a.first_type != CommArgs::kValue) return true;
  if (!ascii_lower(a.first_type_s, lower)) return false;
  if (__builtin_mul_overflow(a.dims_count_i, per(lower), &bytes)) return false;
  dtype = lower;
  has_dtype = !lower.empty();
  return true;
}

}  // namespace

// kineto_map.collectives_table's rows (the rules in that module's doc): per thread, its
// record_param_comms by start, then the communication annotations inside none of them; times
// of the communication kernels each launched, else its own; then all by start. False where a
// collective's args hold something the mapping reads in a way not followed here.
bool map_collectives(const Columns& c, Mapped& m) {
  const Group& g = c.cpu;
  const size_t n = g.ts.size();
  std::vector<char> rpc_of(n, 0), ann_of(n, 0);
  std::vector<int64_t> tids;
  for (size_t i = 0; i < n; ++i) {
    if (!g.name.valid[i]) continue;
    std::string_view name = view(g.name, i);
    rpc_of[i] = is(name, "record_param_comms");
    ann_of[i] = is_comm_annotation(name);
    if (rpc_of[i] || ann_of[i]) tids.push_back(g.tid[i]);
  }
  std::sort(tids.begin(), tids.end());
  tids.erase(std::unique(tids.begin(), tids.end()), tids.end());
  std::vector<CommArgs> args(n);  // of the collectives' events (none where no object)
  for (size_t i = 0; i < n; ++i) {
    if (!(rpc_of[i] || ann_of[i]) || !c.cpu_args.valid[i]) continue;
    std::string_view text = view(c.cpu_args, i);
    try {
      args[i] = read_comm_args(text);
    } catch (const Fallback&) {
      return false;
    }
    if (args[i].odd) return false;
  }
  // the communication kernels whose launch is known, each with its launch's thread and time
  std::vector<size_t> comm;
  for (size_t k = 0; k < m.gpu_category.size(); ++k)
    if (m.gpu_category[k] == static_cast<int64_t>(Category::kCommunication) && m.launch_found[k])
      comm.push_back(k);
  struct Row {
    int64_t cpu_ns, start_ns, end_ns, bytes;
    bool gpu, p2p, has_seq, has_dtype;
    int64_t seq;
    std::string group, op, dtype;
  };
  std::vector<Row> rows;
  const CommArgs none;
  auto by_start = [&](std::vector<size_t>& v) {
    std::stable_sort(v.begin(), v.end(),
                     [&](size_t a, size_t b) { return m.cpu_ts_ns[a] < m.cpu_ts_ns[b]; });
  };
  for (int64_t tid : tids) {
    std::vector<size_t> kernels;  // this thread's, by launch time (ties as found)
    for (size_t k : comm)
      if (m.launch_at_tid[k] == tid) kernels.push_back(k);
    std::stable_sort(kernels.begin(), kernels.end(),
                     [&](size_t a, size_t b) { return m.launch_at_ns[a] < m.launch_at_ns[b]; });
    std::vector<int64_t> launch(kernels.size());
    for (size_t k = 0; k < kernels.size(); ++k) launch[k] = m.launch_at_ns[kernels[k]];
    std::vector<size_t> rpc, ann;
    for (size_t i = 0; i < n; ++i) {
      if (g.tid[i] != tid) continue;
      if (rpc_of[i]) rpc.push_back(i);
      if (ann_of[i]) ann.push_back(i);
    }
    by_start(rpc);
    by_start(ann);
    std::vector<int64_t> rpc_start(rpc.size());
    for (size_t j = 0; j < rpc.size(); ++j) rpc_start[j] = m.cpu_ts_ns[rpc[j]];
    std::vector<int64_t> child(rpc.size(), -1);  // the first annotation inside each operator
    std::vector<size_t> outside;
    for (size_t a : ann) {
      auto after = std::upper_bound(rpc_start.begin(), rpc_start.end(), m.cpu_ts_ns[a]);
      const size_t parent = static_cast<size_t>(after - rpc_start.begin());
      if (parent > 0 && m.cpu_ts_ns[a] <= m.cpu_end_ns[rpc[parent - 1]]) {
        if (child[parent - 1] < 0) child[parent - 1] = static_cast<int64_t>(a);
      } else {
        outside.push_back(a);
      }
    }
    // the kernels this thread launched during an event: [lo, hi) of `launch`
    auto launched = [&](size_t event) {
      return std::make_pair(std::lower_bound(launch.begin(), launch.end(), m.cpu_ts_ns[event]),
                            std::upper_bound(launch.begin(), launch.end(), m.cpu_end_ns[event]));
    };
    auto add = [&](size_t event, auto kernels_during, const std::string_view op_name,
                   const CommArgs& own, const CommArgs& sized) -> bool {
      Row r;
      r.cpu_ns = m.cpu_ts_ns[event];
      const auto [lo, hi] = kernels_during;
      r.gpu = hi > lo;
      r.start_ns = m.cpu_ts_ns[event];
      r.end_ns = m.cpu_end_ns[event];
      if (r.gpu) {
        r.start_ns = std::numeric_limits<int64_t>::max();
        r.end_ns = std::numeric_limits<int64_t>::min();
        for (auto k = lo; k < hi; ++k) {
          r.start_ns = std::min(r.start_ns, m.gpu_ts_ns[kernels[k - launch.begin()]]);
          r.end_ns = std::max(r.end_ns, m.gpu_end_ns[kernels[k - launch.begin()]]);
        }
      }
      if (!normal_op(op_name, r.op)) return false;
      r.p2p = is_p2p(r.op);
      if (!comm_size(sized, r.bytes, r.dtype, r.has_dtype)) return false;
      const int k = own.seq[0] != CommArgs::kNone ? 0 : 1;
      r.has_seq = own.seq[k] == CommArgs::kValue;
      r.seq = own.seq_i[k];
      r.group = own.group == CommArgs::kValue ? own.group_s
              : own.pg_name == CommArgs::kValue ? own.pg_name_s : std::string("0");
      rows.push_back(std::move(r));
      return true;
    };
    for (size_t j = 0; j < rpc.size(); ++j) {
      const size_t e = rpc[j];
      const CommArgs& a = args[e];
      const bool named = a.name == CommArgs::kValue && !a.name_s.empty();
      const auto during = launched(e);
      if (!named && child[j] < 0 && !(during.second > during.first)) continue;  // bookkeeping
      const size_t inside = static_cast<size_t>(child[j]);
      std::string_view op = named ? std::string_view(a.name_s)
                          : child[j] >= 0 ? view(g.name, inside) : std::string_view("unknown");
      const bool from_own = a.nelems != CommArgs::kNone || child[j] < 0;
      if (!add(e, during, op, a, from_own ? a : args[inside])) return false;
    }
    for (size_t e : outside)
      if (!add(e, launched(e), view(g.name, e), none, args[e])) return false;
  }
  const std::vector<size_t> order = stable_order(
      rows.size(), [&](size_t a, size_t b) { return rows[a].start_ns < rows[b].start_ns; });
  bool all_seq = true;
  std::unordered_map<std::string, int64_t> codes;  // each group, by first appearance
  std::unordered_map<int64_t, int64_t> calls;      // per (group, p2p): the calls so far
  for (size_t k : order) {
    const Row& r = rows[k];
    all_seq = all_seq && r.has_seq;
    auto code = codes.emplace(r.group, static_cast<int64_t>(codes.size())).first->second;
    const int64_t before = calls[code * 2 + (r.p2p ? 1 : 0)]++;
    m.coll_step.push_back(step_at(m, r.cpu_ns));
    m.coll_seq.push_back(r.has_seq ? r.seq : before);
    m.coll_bytes.push_back(r.bytes);
    m.coll_p2p.push_back(r.p2p);
    m.coll_start_ns.push_back(r.start_ns);
    m.coll_end_ns.push_back(r.end_ns);
    m.coll_gpu.push_back(r.gpu);
    m.coll_group.add(r.group, true);
    m.coll_op.add(r.op, true);
    m.coll_dtype.add(r.dtype, r.has_dtype);
  }
  m.coll_seq_from_trace.assign(1, all_seq ? 1 : 0);
  return true;
}

}  // namespace dtprof_kineto

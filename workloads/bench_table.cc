#include "workloads/bench_table.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

namespace dlaunch::workloads {
namespace {

constexpr BenchOp kAllOps[] = {
    BenchOp::kAllReduce, BenchOp::kAllGather,     BenchOp::kBroadcast,
    BenchOp::kReduce,    BenchOp::kReduceScatter, BenchOp::kAllToAll,
    BenchOp::kSendRecv,  BenchOp::kScatter,       BenchOp::kGather,
};
// Named in -o lists but not run by "all".
constexpr BenchOp kNamedOps[] = {
    BenchOp::kAllReduce, BenchOp::kAllGather,     BenchOp::kBroadcast,
    BenchOp::kReduce,    BenchOp::kReduceScatter, BenchOp::kAllToAll,
    BenchOp::kSendRecv,  BenchOp::kScatter,       BenchOp::kGather,
    BenchOp::kPingPong,
};

struct DtypeName {
  comm::DType dtype;
  std::string_view name;
};
constexpr DtypeName kDtypes[] = {
    {comm::DType::kF32, "float"}, {comm::DType::kF64, "double"},
    {comm::DType::kF16, "half"},  {comm::DType::kBF16, "bfloat16"},
    {comm::DType::kI8, "int8"},   {comm::DType::kU8, "uint8"},
    {comm::DType::kI32, "int32"}, {comm::DType::kI64, "int64"},
};

std::string all_op_names() {
  std::string s;
  for (BenchOp op : kNamedOps) {
    s += (s.empty() ? "" : ", ") + std::string(bench_op_name(op));
  }
  return s;
}

}  // namespace

std::string_view bench_op_name(BenchOp op) {
  switch (op) {
    case BenchOp::kAllReduce:
      return "all_reduce";
    case BenchOp::kAllGather:
      return "all_gather";
    case BenchOp::kBroadcast:
      return "broadcast";
    case BenchOp::kReduce:
      return "reduce";
    case BenchOp::kReduceScatter:
      return "reduce_scatter";
    case BenchOp::kAllToAll:
      return "all_to_all";
    case BenchOp::kSendRecv:
      return "sendrecv";
    case BenchOp::kScatter:
      return "scatter";
    case BenchOp::kGather:
      return "gather";
    case BenchOp::kPingPong:
      return "pingpong";
  }
  return "?";
}

std::vector<BenchOp> parse_bench_ops(std::string_view s) {
  if (s == "all") return {std::begin(kAllOps), std::end(kAllOps)};
  std::vector<BenchOp> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string_view item =
        s.substr(pos, comma == std::string_view::npos ? s.npos : comma - pos);
    bool found = false;
    for (BenchOp op : kNamedOps) {
      if (item == bench_op_name(op)) {
        out.push_back(op);
        found = true;
      }
    }
    if (!found) {
      throw std::invalid_argument("-o: unknown operation '" +
                                  std::string(item) + "'; valid: all, " +
                                  all_op_names() + " (comma-separated)");
    }
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return out;
}

double bus_factor(BenchOp op, int nranks) {
  double n = nranks;
  switch (op) {
    case BenchOp::kAllReduce:
      return 2.0 * (n - 1) / n;
    case BenchOp::kAllGather:
    case BenchOp::kReduceScatter:
    case BenchOp::kAllToAll:
    case BenchOp::kScatter:
    case BenchOp::kGather:
      return (n - 1) / n;
    case BenchOp::kBroadcast:
    case BenchOp::kReduce:
    case BenchOp::kSendRecv:
    case BenchOp::kPingPong:
      return 1.0;
  }
  return 1.0;
}

bool op_reduces(BenchOp op) {
  return op == BenchOp::kAllReduce || op == BenchOp::kReduce ||
         op == BenchOp::kReduceScatter;
}
bool op_has_root(BenchOp op) {
  return op == BenchOp::kBroadcast || op == BenchOp::kReduce ||
         op == BenchOp::kScatter || op == BenchOp::kGather;
}
bool op_splits(BenchOp op) {
  return op == BenchOp::kAllGather || op == BenchOp::kReduceScatter ||
         op == BenchOp::kAllToAll || op == BenchOp::kScatter ||
         op == BenchOp::kGather;
}

size_t parse_size(std::string_view s, std::string_view flag) {
  auto bad = [&](const std::string& why) {
    return std::invalid_argument(
        std::string(flag) + ": bad size '" + std::string(s) + "' (" + why +
        "); use a byte count with an optional K, M or G suffix (powers of "
        "1024), e.g. 8, 64K, 32M, 1G");
  };
  if (s.empty()) throw bad("empty");
  size_t digits = 0;
  while (digits < s.size() &&
         std::isdigit(static_cast<unsigned char>(s[digits]))) {
    ++digits;
  }
  if (digits == 0) throw bad("no number");
  uint64_t mult = 1;
  std::string_view rest = s.substr(digits);
  if (rest.size() > 1) throw bad("unknown suffix");
  if (rest.size() == 1) {
    switch (std::toupper(static_cast<unsigned char>(rest[0]))) {
      case 'K':
        mult = 1ull << 10;
        break;
      case 'M':
        mult = 1ull << 20;
        break;
      case 'G':
        mult = 1ull << 30;
        break;
      default:
        throw bad("unknown suffix");
    }
  }
  uint64_t v = 0;
  for (size_t i = 0; i < digits; ++i) {
    if (v > (std::numeric_limits<uint64_t>::max() - 9) / 10) {
      throw bad("too large");
    }
    v = v * 10 + static_cast<uint64_t>(s[i] - '0');
  }
  if (v > std::numeric_limits<uint64_t>::max() / mult) throw bad("too large");
  return static_cast<size_t>(v * mult);
}

comm::DType parse_nccl_dtype(std::string_view s) {
  for (const DtypeName& d : kDtypes) {
    if (s == d.name) return d.dtype;
  }
  std::string valid;
  for (const DtypeName& d : kDtypes) {
    valid += (valid.empty() ? "" : ", ") + std::string(d.name);
  }
  throw std::invalid_argument("-d: unknown data type '" + std::string(s) +
                              "'; valid: " + valid);
}

std::string_view nccl_dtype_name(comm::DType t) {
  for (const DtypeName& d : kDtypes) {
    if (d.dtype == t) return d.name;
  }
  return "?";
}

comm::ReduceOp parse_redop(std::string_view s) {
  if (s == "sum") return comm::ReduceOp::kSum;
  if (s == "prod") return comm::ReduceOp::kProduct;
  if (s == "min") return comm::ReduceOp::kMin;
  if (s == "max") return comm::ReduceOp::kMax;
  if (s == "avg") return comm::ReduceOp::kAvg;
  throw std::invalid_argument("--redop: unknown reduction '" + std::string(s) +
                              "'; valid: sum, prod, min, max, avg");
}

std::vector<size_t> size_sweep(size_t min_bytes, size_t max_bytes,
                               double factor, size_t increment) {
  if (min_bytes > max_bytes) {
    throw std::invalid_argument("-b " + std::to_string(min_bytes) +
                                " is larger than -e " +
                                std::to_string(max_bytes) +
                                "; the minimum size must not exceed the "
                                "maximum");
  }
  if (!(factor > 1.0) && increment == 0 && min_bytes != max_bytes) {
    throw std::invalid_argument(
        "sizes would never grow: pass -f FACTOR above 1 or -i INCREMENT "
        "above 0 (or equal -b and -e)");
  }
  std::vector<size_t> out;
  for (size_t b = min_bytes; b <= max_bytes;) {
    out.push_back(b);
    size_t next =
        factor > 1.0
            ? static_cast<size_t>(std::ceil(static_cast<double>(b) * factor))
            : b + increment;
    if (next <= b) break;  // min == max, or 0 * factor
    b = next;
  }
  return out;
}

void compute_bandwidth(BenchRow& row, BenchOp op, int nranks) {
  double sec = row.time_us * 1e-6;
  row.algbw = sec > 0 ? static_cast<double>(row.bytes) / 1e9 / sec : 0;
  row.busbw = row.algbw * bus_factor(op, nranks);
}

std::string format_header() {
  char buf[512];
  std::string out = "#\n";
  std::snprintf(buf, sizeof buf, "# %10s  %12s  %8s  %6s  %6s  %33s\n", "", "",
                "", "", "", "out-of-place");
  out += buf;
  std::snprintf(buf, sizeof buf,
                "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size",
                "count", "type", "redop", "root", "time", "algbw", "busbw",
                "#wrong");
  out += buf;
  std::snprintf(buf, sizeof buf,
                "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)",
                "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "");
  out += buf;
  return out;
}

std::string format_row(const BenchRow& row) {
  char time[32];
  if (row.time_us >= 10000.0) {
    std::snprintf(time, sizeof time, "%7.0f", row.time_us);
  } else if (row.time_us >= 100.0) {
    std::snprintf(time, sizeof time, "%7.1f", row.time_us);
  } else if (row.time_us >= 1.0) {
    std::snprintf(time, sizeof time, "%7.2f", row.time_us);
  } else {
    // Nanoseconds below 1 us: two 8-byte ping-pongs of 0.18 and 0.25 us
    // must not both read 0.2.
    std::snprintf(time, sizeof time, "%7.3f", row.time_us);
  }
  char wrong[32];
  if (row.wrong < 0) {
    std::snprintf(wrong, sizeof wrong, "%6s", "N/A");
  } else {
    std::snprintf(wrong, sizeof wrong, "%6lld",
                  static_cast<long long>(row.wrong));
  }
  char buf[256];
  std::snprintf(
      buf, sizeof buf, "%12zu  %12zu  %8s  %6s  %6d  %7s  %6.2f  %6.2f  %6s",
      row.bytes, row.count, std::string(nccl_dtype_name(row.dtype)).c_str(),
      row.redop.c_str(), row.root, time, row.algbw, row.busbw, wrong);
  return buf;
}

}  // namespace dlaunch::workloads

#include "workloads/bench_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

namespace dlaunch::workloads {
namespace {

using ::testing::HasSubstr;

TEST(BenchTableTest, ParseSize) {
  EXPECT_EQ(parse_size("8"), 8u);
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("1K"), 1024u);
  EXPECT_EQ(parse_size("64k"), 64u * 1024);
  EXPECT_EQ(parse_size("32M"), 32u << 20);
  EXPECT_EQ(parse_size("2G"), 2ull << 30);
  for (const char* bad :
       {"", "M", "1.5M", "12Q", "1KB", "-4", "99999999999999999999"}) {
    try {
      parse_size(bad, "-b");
      FAIL() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("-b: bad size"));
      EXPECT_THAT(e.what(), HasSubstr("K, M or G"));
    }
  }
}

TEST(BenchTableTest, DtypesUseNcclTestsNames) {
  const char* names[] = {"float", "double", "half",  "bfloat16",
                         "int8",  "uint8",  "int32", "int64"};
  for (const char* n : names) {
    EXPECT_EQ(nccl_dtype_name(parse_nccl_dtype(n)), n);
  }
  EXPECT_EQ(parse_nccl_dtype("half"), comm::DType::kF16);
  EXPECT_EQ(parse_nccl_dtype("bfloat16"), comm::DType::kBF16);
  try {
    parse_nccl_dtype("float32");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("'float32'"));
    EXPECT_THAT(e.what(), HasSubstr("bfloat16"));
  }
}

TEST(BenchTableTest, Redops) {
  EXPECT_EQ(parse_redop("sum"), comm::ReduceOp::kSum);
  EXPECT_EQ(parse_redop("prod"), comm::ReduceOp::kProduct);
  EXPECT_EQ(parse_redop("avg"), comm::ReduceOp::kAvg);
  EXPECT_THROW(parse_redop("band"), std::invalid_argument);
}

TEST(BenchTableTest, Ops) {
  EXPECT_EQ(parse_bench_ops("all").size(), 9u);
  EXPECT_EQ(parse_bench_ops("all")[0], BenchOp::kAllReduce);
  EXPECT_EQ(
      parse_bench_ops("reduce_scatter,sendrecv"),
      (std::vector<BenchOp>{BenchOp::kReduceScatter, BenchOp::kSendRecv}));
  try {
    parse_bench_ops("all_reduce,allreduce");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("'allreduce'"));
    EXPECT_THAT(e.what(), HasSubstr("all_to_all"));
  }
  EXPECT_THROW(parse_bench_ops(""), std::invalid_argument);
  // pingpong is named, not part of "all".
  EXPECT_EQ(parse_bench_ops("pingpong"),
            std::vector<BenchOp>{BenchOp::kPingPong});
  EXPECT_EQ(bench_op_name(BenchOp::kPingPong), "pingpong");
}

TEST(BenchTableTest, BusFactors) {
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kAllReduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kReduceScatter, 8), 0.875);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kAllToAll, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kBroadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kReduce, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kSendRecv, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::kGather, 4), 0.75);
  BenchRow r;
  r.bytes = 1000000;
  r.time_us = 1000;  // 1 MB in 1 ms = 1 GB/s
  compute_bandwidth(r, BenchOp::kAllReduce, 4);
  EXPECT_DOUBLE_EQ(r.algbw, 1.0);
  EXPECT_DOUBLE_EQ(r.busbw, 1.5);
}

TEST(BenchTableTest, Sweep) {
  EXPECT_EQ(size_sweep(8, 64, 2, 0), (std::vector<size_t>{8, 16, 32, 64}));
  EXPECT_EQ(size_sweep(8, 100, 2, 0), (std::vector<size_t>{8, 16, 32, 64}));
  EXPECT_EQ(size_sweep(10, 30, 1, 10), (std::vector<size_t>{10, 20, 30}));
  EXPECT_EQ(size_sweep(32, 32, 1, 0), (std::vector<size_t>{32}));
  EXPECT_THROW(size_sweep(64, 8, 2, 0), std::invalid_argument);
  EXPECT_THROW(size_sweep(8, 64, 1, 0), std::invalid_argument);
}

TEST(BenchTableTest, FormatMatchesNcclTestsColumns) {
  std::string h = format_header();
  std::istringstream lines(h);
  std::string l1, l2, l3, l4;
  std::getline(lines, l1);
  std::getline(lines, l2);
  std::getline(lines, l3);
  std::getline(lines, l4);
  EXPECT_EQ(l1, "#");
  EXPECT_THAT(l2, HasSubstr("out-of-place"));
  // Column names in nccl-tests' order.
  std::istringstream cols(l3);
  std::vector<std::string> names;
  for (std::string w; cols >> w;) names.push_back(w);
  EXPECT_EQ(names, (std::vector<std::string>{"#", "size", "count", "type",
                                             "redop", "root", "time", "algbw",
                                             "busbw", "#wrong"}));
  EXPECT_THAT(l4, HasSubstr("(us)"));

  BenchRow r;
  r.bytes = 1048576;
  r.count = 262144;
  r.dtype = comm::DType::kF32;
  r.redop = "sum";
  r.root = -1;
  r.time_us = 123.456;
  r.algbw = 8.49;
  r.busbw = 12.74;
  r.wrong = 0;
  std::string row = format_row(r);
  EXPECT_EQ(row,
            "     1048576        262144     float     sum      -1    123.5    "
            "8.49   12.74       0");
  // Each value ends where its header column ends.
  EXPECT_EQ(row.find("262144") + 6, l3.find("count") + 5);
  EXPECT_EQ(row.find("12.74") + 5, l3.find("busbw") + 5);
  r.time_us = 12345;
  r.wrong = -1;
  EXPECT_THAT(format_row(r), HasSubstr("  12345  "));
  EXPECT_THAT(format_row(r), HasSubstr("N/A"));
  r.time_us = 5.5;
  EXPECT_THAT(format_row(r), HasSubstr("   5.50  "));
  r.time_us = 0.1834;  // a small ping-pong: nanoseconds shown
  EXPECT_THAT(format_row(r), HasSubstr("  0.183  "));
}

}  // namespace
}  // namespace dlaunch::workloads

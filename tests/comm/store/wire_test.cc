#include "comm/store/wire.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dlaunch::comm::store::wire {
namespace {

using namespace std::string_view_literals;

// Splits `bytes` into one frame, checking it spans the whole buffer.
Frame one_frame(const std::string& bytes) {
  Frame f;
  std::string err;
  EXPECT_EQ(next_frame(bytes, kDefaultMaxFrameBytes, f, err), DecodeStatus::kOk)
      << err;
  EXPECT_EQ(f.size, bytes.size());
  return f;
}

void round_trip(const Request& in) {
  std::string bytes;
  encode_request(in, bytes);
  Frame f = one_frame(bytes);
  EXPECT_EQ(f.type, in.type);
  Request out;
  std::string err;
  EXPECT_EQ(decode_request(f, out, err), DecodeStatus::kOk) << err;
  EXPECT_EQ(out.keys, in.keys);
  EXPECT_EQ(out.values, in.values);
  EXPECT_EQ(out.delta, in.delta);
  EXPECT_EQ(out.timeout_ms, in.timeout_ms);
}

TEST(WireTest, HelloIsMagicVersionAndFlagsLittleEndian) {
  std::string bytes;
  encode_hello({}, bytes);
  EXPECT_EQ(bytes, std::string("DLST\x03\x00\x00\x00", 8));
  std::string server;
  encode_hello({.flags = kAuthRequired}, server);
  EXPECT_EQ(server, std::string("DLST\x03\x00\x01\x00", 8));
  Hello flagged;
  EXPECT_EQ(decode_hello(server, flagged), DecodeStatus::kOk);
  EXPECT_EQ(flagged.flags, kAuthRequired);
  Hello h{0, 0};
  EXPECT_EQ(decode_hello(bytes.substr(0, 7), h), DecodeStatus::kNeedMore);
  EXPECT_EQ(decode_hello(bytes, h), DecodeStatus::kOk);
  EXPECT_EQ(h.magic, kMagic);
  EXPECT_EQ(h.version, kVersion);
}

TEST(WireTest, SetFrameHasTheDocumentedBytes) {
  std::string bytes;
  encode_request({.type = MsgType::kSet, .keys = {"k"}, .values = {"vv"}},
                 bytes);
  // u32 body length 11, type 1, "k" as u32 1 + 'k', "vv" as u32 2 + "vv".
  EXPECT_EQ(bytes, std::string("\x0b\x00\x00\x00\x01"
                               "\x01\x00\x00\x00k"
                               "\x02\x00\x00\x00vv",
                               16));
}

TEST(WireTest, EveryRequestRoundTrips) {
  std::string big(100000, 'x');
  big[7] = '\0';
  std::vector<Request> requests = {
      {.type = MsgType::kSet, .keys = {"key"}, .values = {big}},
      {.type = MsgType::kSet, .keys = {""}, .values = {""}},
      {.type = MsgType::kGet, .keys = {"a/b"}, .timeout_ms = 5000},
      {.type = MsgType::kAdd, .keys = {"n"}, .delta = -42},
      {.type = MsgType::kAdd, .keys = {"n"}, .delta = INT64_MIN},
      {.type = MsgType::kCompareSet, .keys = {"k"}, .values = {"", "new"}},
      {.type = MsgType::kWait,
       .keys = {"rank_0", "rank_1", "rank_2"},
       .timeout_ms = UINT64_MAX},
      {.type = MsgType::kWait, .keys = {}, .timeout_ms = 1},
      {.type = MsgType::kCheck, .keys = {"a", "b"}},
      {.type = MsgType::kDeleteKey, .keys = {"gone"}},
      {.type = MsgType::kNumKeys},
      {.type = MsgType::kMultiGet, .keys = {"x", "y"}, .timeout_ms = 7},
      {.type = MsgType::kMultiSet, .keys = {"x", "y"}, .values = {"1", "2"}},
      {.type = MsgType::kAppend, .keys = {"log"}, .values = {"line\n"}},
      {.type = MsgType::kAuth, .values = {"the-token"}},
      {.type = MsgType::kAuth, .values = {""}},
      {.type = MsgType::kAppendOnClose,
       .keys = {"gone"},
       .values = {"node 3;"},
       .timeout_ms = 15000},
  };
  for (const Request& r : requests) {
    SCOPED_TRACE(msg_type_name(r.type));
    round_trip(r);
  }
}

TEST(WireTest, EveryResponseRoundTrips) {
  std::vector<Response> responses = {
      {.type = MsgType::kOk},
      {.type = MsgType::kValue, .values = {"v\0v"sv}},
      {.type = MsgType::kValues, .values = {"a", "", "c"}},
      {.type = MsgType::kInteger, .integer = INT64_MAX},
      {.type = MsgType::kBool, .integer = 1},
      {.type = MsgType::kBool, .integer = 0},
      {.type = MsgType::kTimedOut, .total_keys = 8, .missing = {3, 7}},
      {.type = MsgType::kError, .message = "add: not an integer"},
  };
  for (const Response& in : responses) {
    SCOPED_TRACE(msg_type_name(in.type));
    std::string bytes;
    encode_response(in, bytes);
    Frame f = one_frame(bytes);
    Response out;
    std::string err;
    ASSERT_EQ(decode_response(f, out, err), DecodeStatus::kOk) << err;
    EXPECT_EQ(out.type, in.type);
    EXPECT_EQ(out.values, in.values);
    EXPECT_EQ(out.integer, in.integer);
    EXPECT_EQ(out.total_keys, in.total_keys);
    EXPECT_EQ(out.missing, in.missing);
    EXPECT_EQ(out.message, in.message);
  }
}

TEST(WireTest, ReusedRequestKeepsNoStaleFields) {
  std::string a, b;
  encode_request(
      {.type = MsgType::kMultiSet, .keys = {"x", "y"}, .values = {"1", "2"}},
      a);
  encode_request({.type = MsgType::kNumKeys}, b);
  Request r;
  std::string err;
  ASSERT_EQ(decode_request(one_frame(a), r, err), DecodeStatus::kOk);
  ASSERT_EQ(decode_request(one_frame(b), r, err), DecodeStatus::kOk);
  EXPECT_TRUE(r.keys.empty());
  EXPECT_TRUE(r.values.empty());
}

TEST(WireTest, FramesSplitFromAStreamAtEveryBoundary) {
  std::string stream;
  encode_request({.type = MsgType::kSet, .keys = {"a"}, .values = {"1"}},
                 stream);
  encode_request({.type = MsgType::kNumKeys}, stream);
  size_t first = 0;
  {
    std::string one;
    encode_request({.type = MsgType::kSet, .keys = {"a"}, .values = {"1"}},
                   one);
    first = one.size();
  }
  std::string err;
  for (size_t n = 0; n < first; ++n) {
    Frame f;
    EXPECT_EQ(next_frame(std::string_view(stream).substr(0, n),
                         kDefaultMaxFrameBytes, f, err),
              DecodeStatus::kNeedMore)
        << "prefix of " << n << " bytes";
  }
  Frame f;
  ASSERT_EQ(next_frame(stream, kDefaultMaxFrameBytes, f, err),
            DecodeStatus::kOk);
  EXPECT_EQ(f.size, first);
  ASSERT_EQ(next_frame(std::string_view(stream).substr(f.size),
                       kDefaultMaxFrameBytes, f, err),
            DecodeStatus::kOk);
  EXPECT_EQ(f.type, MsgType::kNumKeys);
  EXPECT_EQ(f.body.size(), 0u);
}

TEST(WireTest, LengthOverTheCapIsRejectedFromTheHeaderAlone) {
  std::string header("\xff\xff\xff\xff\x01", 5);
  Frame f;
  std::string err;
  EXPECT_EQ(next_frame(header, kDefaultMaxFrameBytes, f, err),
            DecodeStatus::kBad);
  EXPECT_EQ(err, "frame length 4294967295 exceeds the limit of 67108864 bytes");
  // At the cap exactly is fine (the body is merely incomplete).
  std::string at_cap("\x10\x00\x00\x00\x01", 5);
  EXPECT_EQ(next_frame(at_cap, 16, f, err), DecodeStatus::kNeedMore);
  EXPECT_EQ(next_frame(at_cap, 15, f, err), DecodeStatus::kBad);
}

// A frame with the given type and raw body.
std::string raw_frame(MsgType type, std::string_view body) {
  std::string out;
  uint32_t n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(n >> (8 * i)));
  out.push_back(static_cast<char>(type));
  out.append(body);
  return out;
}

TEST(WireTest, MalformedRequestBodiesAreBadWithAReason) {
  struct Case {
    MsgType type;
    std::string body;
    std::string error;
  };
  std::vector<Case> cases = {
      {MsgType::kSet,
       std::string("\x05\x00\x00\x00"
                   "ab",
                   6),
       "set frame of 6 bytes is malformed: truncated body"},
      {MsgType::kGet, std::string("\x01\x00\x00\x00k\x01\x02", 7),
       "get frame of 7 bytes is malformed: truncated body"},
      {MsgType::kNumKeys, "x",
       "num_keys frame of 1 bytes is malformed: trailing bytes after body"},
      {MsgType::kWait, std::string("\xff\xff\xff\x7f", 4),
       "wait frame of 4 bytes is malformed: list count beyond frame"},
      {MsgType::kMultiSet,
       std::string("\x01\x00\x00\x00\x01\x00\x00\x00k\x00\x00\x00\x00", 13),
       "multi_set frame of 13 bytes is malformed: key and value counts "
       "differ"},
      {MsgType::kOk, "", "unknown request type ok"},
      {static_cast<MsgType>(0), "", "unknown request type 0x00"},
      {static_cast<MsgType>(200), "", "unknown request type 0xc8"},
  };
  for (const Case& c : cases) {
    std::string bytes = raw_frame(c.type, c.body);
    Frame f = one_frame(bytes);
    Request r;
    std::string err;
    EXPECT_EQ(decode_request(f, r, err), DecodeStatus::kBad) << c.error;
    EXPECT_EQ(err, c.error);
  }
}

TEST(WireTest, MalformedResponseBodiesAreBad) {
  std::vector<std::string> frames = {
      raw_frame(MsgType::kBool, "\x02"),
      raw_frame(MsgType::kInteger, "1234567"),
      raw_frame(
          MsgType::kTimedOut,
          std::string("\x02\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00", 12)),
      raw_frame(MsgType::kSet, ""),
  };
  for (const std::string& bytes : frames) {
    Frame f = one_frame(bytes);
    Response r;
    std::string err;
    EXPECT_EQ(decode_response(f, r, err), DecodeStatus::kBad)
        << msg_type_name(f.type);
    EXPECT_FALSE(err.empty());
  }
}

TEST(WireTest, DirectionsAndNames) {
  EXPECT_TRUE(is_request(MsgType::kSet));
  EXPECT_TRUE(is_request(MsgType::kAppend));
  EXPECT_FALSE(is_request(MsgType::kOk));
  EXPECT_TRUE(is_response(MsgType::kError));
  EXPECT_FALSE(is_response(MsgType::kAppend));
  EXPECT_FALSE(is_response(static_cast<MsgType>(71)));
  EXPECT_EQ(msg_type_name(MsgType::kCompareSet), "compare_set");
  EXPECT_EQ(msg_type_name(static_cast<MsgType>(0xab)), "0xab");
}

}  // namespace
}  // namespace dlaunch::comm::store::wire

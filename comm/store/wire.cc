#include "comm/store/wire.h"

#include <cstring>
#include <limits>

#include "comm/check.h"

namespace dlaunch::comm::store::wire {
namespace {

// Explicit little-endian stores and loads: the wire format does not depend on
// the host's byte order.
template <typename T>
void put_le(std::string& out, T v) {
  char bytes[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i) {
    bytes[i] = static_cast<char>(static_cast<uint64_t>(v) >> (8 * i));
  }
  out.append(bytes, sizeof(T));
}

template <typename T>
T get_le(const char* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  }
  return static_cast<T>(v);
}

void put_bytes(std::string& out, std::string_view s) {
  DLAUNCH_CHECK(s.size() <= std::numeric_limits<uint32_t>::max(),
                "byte string longer than 4 GiB");
  put_le<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out.append(s);
}

void put_list(std::string& out, const std::vector<std::string_view>& items) {
  put_le<uint32_t>(out, static_cast<uint32_t>(items.size()));
  for (std::string_view s : items) put_bytes(out, s);
}

// Reserves the frame header, lets the caller append the body, then patches
// the body length in.
class FrameWriter {
 public:
  FrameWriter(std::string& out, MsgType type) : out_(out), start_(out.size()) {
    put_le<uint32_t>(out_, 0);
    out_.push_back(static_cast<char>(type));
  }
  ~FrameWriter() {
    size_t body = out_.size() - start_ - kFrameHeaderBytes;
    DLAUNCH_CHECK(body <= std::numeric_limits<uint32_t>::max(),
                  "frame body longer than 4 GiB");
    for (size_t i = 0; i < 4; ++i) {
      out_[start_ + i] = static_cast<char>(body >> (8 * i));
    }
  }
  FrameWriter(const FrameWriter&) = delete;
  FrameWriter& operator=(const FrameWriter&) = delete;

 private:
  std::string& out_;
  size_t start_;
};

// Bounds-checked reads from a frame body. The first failure sticks: later
// reads return zero values and ok() stays false, so decoders check once.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}

  template <typename T>
  T le() {
    if (!take(sizeof(T))) return T{};
    return get_le<T>(in_.data() + pos_ - sizeof(T));
  }

  std::string_view bytes() {
    uint32_t n = le<uint32_t>();
    if (!take(n)) return {};
    return in_.substr(pos_ - n, n);
  }

  // A list of byte strings; the count is checked against what is left so an
  // absurd count fails before anything is reserved.
  void list(std::vector<std::string_view>& out) {
    out.clear();
    uint32_t n = le<uint32_t>();
    if (!ok_ || n > remaining() / 4) return fail("list count beyond frame");
    out.reserve(n);
    for (uint32_t i = 0; i < n && ok_; ++i) out.push_back(bytes());
  }

  void u32_list(std::vector<uint32_t>& out) {
    out.clear();
    uint32_t n = le<uint32_t>();
    if (!ok_ || n > remaining() / 4) return fail("list count beyond frame");
    out.reserve(n);
    for (uint32_t i = 0; i < n && ok_; ++i) out.push_back(le<uint32_t>());
  }

  void fail(const char* why) {
    if (ok_) why_ = why;
    ok_ = false;
  }

  // Ends decoding: OK only when every read fit and nothing is left over.
  DecodeStatus finish(const Frame& frame, std::string& error) {
    if (ok_ && pos_ != in_.size()) fail("trailing bytes after body");
    if (ok_) return DecodeStatus::kOk;
    error = msg_type_name(frame.type) + " frame of " +
            std::to_string(in_.size()) + " bytes is malformed: " + why_;
    return DecodeStatus::kBad;
  }

 private:
  size_t remaining() const { return in_.size() - pos_; }
  bool take(size_t n) {
    if (!ok_) return false;
    if (n > remaining()) {
      fail("truncated body");
      return false;
    }
    pos_ += n;
    return true;
  }

  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
  const char* why_ = "";
};

}  // namespace

bool is_request(MsgType type) {
  auto v = static_cast<uint8_t>(type);
  return v >= static_cast<uint8_t>(MsgType::kSet) &&
         v <= static_cast<uint8_t>(MsgType::kAuth);
}

bool is_response(MsgType type) {
  auto v = static_cast<uint8_t>(type);
  return v >= static_cast<uint8_t>(MsgType::kOk) &&
         v <= static_cast<uint8_t>(MsgType::kError);
}

std::string msg_type_name(MsgType type) {
  switch (type) {
    case MsgType::kSet:
      return "set";
    case MsgType::kGet:
      return "get";
    case MsgType::kAdd:
      return "add";
    case MsgType::kCompareSet:
      return "compare_set";
    case MsgType::kWait:
      return "wait";
    case MsgType::kCheck:
      return "check";
    case MsgType::kDeleteKey:
      return "delete_key";
    case MsgType::kNumKeys:
      return "num_keys";
    case MsgType::kMultiGet:
      return "multi_get";
    case MsgType::kMultiSet:
      return "multi_set";
    case MsgType::kAppend:
      return "append";
    case MsgType::kAppendOnClose:
      return "append_on_close";
    case MsgType::kAuth:
      return "auth";
    case MsgType::kOk:
      return "ok";
    case MsgType::kValue:
      return "value";
    case MsgType::kValues:
      return "values";
    case MsgType::kInteger:
      return "integer";
    case MsgType::kBool:
      return "bool";
    case MsgType::kTimedOut:
      return "timed_out";
    case MsgType::kError:
      return "error";
  }
  static const char kHex[] = "0123456789abcdef";
  auto v = static_cast<uint8_t>(type);
  return std::string("0x") + kHex[v >> 4] + kHex[v & 15];
}

void encode_hello(const Hello& hello, std::string& out) {
  put_le<uint32_t>(out, hello.magic);
  put_le<uint16_t>(out, hello.version);
  put_le<uint16_t>(out, hello.flags);
}

DecodeStatus decode_hello(std::string_view in, Hello& out) {
  if (in.size() < kHelloBytes) return DecodeStatus::kNeedMore;
  out.magic = get_le<uint32_t>(in.data());
  out.version = get_le<uint16_t>(in.data() + 4);
  out.flags = get_le<uint16_t>(in.data() + 6);
  return DecodeStatus::kOk;
}

DecodeStatus next_frame(std::string_view in, size_t max_body_bytes, Frame& out,
                        std::string& error) {
  if (in.size() < kFrameHeaderBytes) return DecodeStatus::kNeedMore;
  uint32_t body = get_le<uint32_t>(in.data());
  out.type = static_cast<MsgType>(static_cast<uint8_t>(in[4]));
  if (body > max_body_bytes) {
    error = "frame length " + std::to_string(body) + " exceeds the limit of " +
            std::to_string(max_body_bytes) + " bytes";
    return DecodeStatus::kBad;
  }
  if (in.size() - kFrameHeaderBytes < body) return DecodeStatus::kNeedMore;
  out.body = in.substr(kFrameHeaderBytes, body);
  out.size = kFrameHeaderBytes + body;
  return DecodeStatus::kOk;
}

void encode_request(const Request& r, std::string& out) {
  auto need = [&](size_t keys, size_t values) {
    DLAUNCH_CHECK(r.keys.size() == keys && r.values.size() == values,
                  "request fields do not match its type");
  };
  FrameWriter frame(out, r.type);
  switch (r.type) {
    case MsgType::kSet:
    case MsgType::kAppend:
      need(1, 1);
      put_bytes(out, r.keys[0]);
      put_bytes(out, r.values[0]);
      break;
    case MsgType::kAppendOnClose:
      need(1, 1);
      put_bytes(out, r.keys[0]);
      put_bytes(out, r.values[0]);
      put_le<uint64_t>(out, r.timeout_ms);
      break;
    case MsgType::kGet:
      need(1, 0);
      put_bytes(out, r.keys[0]);
      put_le<uint64_t>(out, r.timeout_ms);
      break;
    case MsgType::kAdd:
      need(1, 0);
      put_bytes(out, r.keys[0]);
      put_le<int64_t>(out, r.delta);
      break;
    case MsgType::kCompareSet:
      need(1, 2);
      put_bytes(out, r.keys[0]);
      put_bytes(out, r.values[0]);
      put_bytes(out, r.values[1]);
      break;
    case MsgType::kWait:
    case MsgType::kMultiGet:
      need(r.keys.size(), 0);
      put_list(out, r.keys);
      put_le<uint64_t>(out, r.timeout_ms);
      break;
    case MsgType::kCheck:
      need(r.keys.size(), 0);
      put_list(out, r.keys);
      break;
    case MsgType::kDeleteKey:
      need(1, 0);
      put_bytes(out, r.keys[0]);
      break;
    case MsgType::kNumKeys:
      need(0, 0);
      break;
    case MsgType::kAuth:
      need(0, 1);
      put_bytes(out, r.values[0]);
      break;
    case MsgType::kMultiSet:
      need(r.keys.size(), r.keys.size());
      put_list(out, r.keys);
      put_list(out, r.values);
      break;
    default:
      DLAUNCH_CHECK(false, "encode_request given a response type");
  }
}

void encode_response(const Response& r, std::string& out) {
  FrameWriter frame(out, r.type);
  switch (r.type) {
    case MsgType::kOk:
      break;
    case MsgType::kValue:
      DLAUNCH_CHECK(r.values.size() == 1, "kValue carries one value");
      put_bytes(out, r.values[0]);
      break;
    case MsgType::kValues:
      put_list(out, r.values);
      break;
    case MsgType::kInteger:
      put_le<int64_t>(out, r.integer);
      break;
    case MsgType::kBool:
      out.push_back(r.integer != 0 ? 1 : 0);
      break;
    case MsgType::kTimedOut:
      put_le<uint32_t>(out, r.total_keys);
      put_le<uint32_t>(out, static_cast<uint32_t>(r.missing.size()));
      for (uint32_t i : r.missing) put_le<uint32_t>(out, i);
      break;
    case MsgType::kError:
      put_bytes(out, r.message);
      break;
    default:
      DLAUNCH_CHECK(false, "encode_response given a request type");
  }
}

DecodeStatus decode_request(const Frame& frame, Request& r,
                            std::string& error) {
  Reader in(frame.body);
  r.type = frame.type;
  r.keys.clear();
  r.values.clear();
  r.delta = 0;
  r.timeout_ms = 0;
  switch (frame.type) {
    case MsgType::kSet:
    case MsgType::kAppend:
      r.keys.push_back(in.bytes());
      r.values.push_back(in.bytes());
      break;
    case MsgType::kAppendOnClose:
      r.keys.push_back(in.bytes());
      r.values.push_back(in.bytes());
      r.timeout_ms = in.le<uint64_t>();
      break;
    case MsgType::kGet:
      r.keys.push_back(in.bytes());
      r.timeout_ms = in.le<uint64_t>();
      break;
    case MsgType::kAdd:
      r.keys.push_back(in.bytes());
      r.delta = in.le<int64_t>();
      break;
    case MsgType::kCompareSet:
      r.keys.push_back(in.bytes());
      r.values.push_back(in.bytes());
      r.values.push_back(in.bytes());
      break;
    case MsgType::kWait:
    case MsgType::kMultiGet:
      in.list(r.keys);
      r.timeout_ms = in.le<uint64_t>();
      break;
    case MsgType::kCheck:
      in.list(r.keys);
      break;
    case MsgType::kDeleteKey:
      r.keys.push_back(in.bytes());
      break;
    case MsgType::kNumKeys:
      break;
    case MsgType::kAuth:
      r.values.push_back(in.bytes());
      break;
    case MsgType::kMultiSet:
      in.list(r.keys);
      in.list(r.values);
      if (r.keys.size() != r.values.size()) {
        in.fail("key and value counts differ");
      }
      break;
    default:
      error = "unknown request type " + msg_type_name(frame.type);
      return DecodeStatus::kBad;
  }
  return in.finish(frame, error);
}

DecodeStatus decode_response(const Frame& frame, Response& r,
                             std::string& error) {
  Reader in(frame.body);
  r.type = frame.type;
  r.values.clear();
  r.integer = 0;
  r.total_keys = 0;
  r.missing.clear();
  r.message = {};
  switch (frame.type) {
    case MsgType::kOk:
      break;
    case MsgType::kValue:
      r.values.push_back(in.bytes());
      break;
    case MsgType::kValues:
      in.list(r.values);
      break;
    case MsgType::kInteger:
      r.integer = in.le<int64_t>();
      break;
    case MsgType::kBool: {
      uint8_t b = in.le<uint8_t>();
      if (b > 1) in.fail("bool is neither 0 nor 1");
      r.integer = b;
      break;
    }
    case MsgType::kTimedOut:
      r.total_keys = in.le<uint32_t>();
      in.u32_list(r.missing);
      for (uint32_t i : r.missing) {
        if (i >= r.total_keys) in.fail("missing-key index out of range");
      }
      break;
    case MsgType::kError:
      r.message = in.bytes();
      break;
    default:
      error = "unknown response type " + msg_type_name(frame.type);
      return DecodeStatus::kBad;
  }
  return in.finish(frame, error);
}

}  // namespace dlaunch::comm::store::wire

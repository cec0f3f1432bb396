#pragma once

// The store's wire protocol: every byte the client and server exchange is
// encoded and decoded here (docs/store.md describes the format).
//
//   handshake (both directions, once): u32 magic "DLST", u16 version,
//     u16 flags (the server's kAuthRequired; zero from a client)
//   frame: u32 body length, u8 MsgType, body
//   a server with a token needs kAuth as the first frame (docs/store.md)
//
// Integers are little-endian; a byte string is a u32 length then the bytes; a
// list is a u32 count then its items. Decoders never read past the buffer they
// are given and report malformed input as kBad with a one-line reason.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dlaunch::comm::store::wire {

// "DLST" read as a little-endian u32.
inline constexpr uint32_t kMagic = 0x54534C44;
// 3: the hello's flags and kAuth (the job's token).
inline constexpr uint16_t kVersion = 3;
inline constexpr size_t kHelloBytes = 8;
inline constexpr size_t kFrameHeaderBytes = 5;
// Hello flag from the server: send kAuth with the job's token first.
inline constexpr uint16_t kAuthRequired = 1;
// The longest token a client may present; also the frame limit before a
// connection is authenticated (what a stranger can make the server buffer).
inline constexpr size_t kMaxTokenBytes = 1024;
// Default cap on a frame body; the server's is StoreServerOptions.
inline constexpr size_t kDefaultMaxFrameBytes = size_t{64} << 20;
// The most a response body may hold: a client treats a longer one as a
// protocol error, and the server refuses to build one (a get or multi_get
// that would answer more).
inline constexpr size_t kMaxResponseBytes = size_t{1} << 30;

enum class MsgType : uint8_t {
  // Requests (client -> server).
  kSet = 1,             // key, value                  -> kOk
  kGet = 2,             // key, u64 timeout ms         -> kValue | kTimedOut
  kAdd = 3,             // key, i64 delta              -> kInteger
  kCompareSet = 4,      // key, expected, desired      -> kValue
  kWait = 5,            // keys, u64 timeout ms        -> kOk | kTimedOut
  kCheck = 6,           // keys                        -> kBool
  kDeleteKey = 7,       // key                         -> kBool
  kNumKeys = 8,         // (empty)                     -> kInteger
  kMultiGet = 9,        // keys, u64 timeout ms        -> kValues | kTimedOut
  kMultiSet = 10,       // keys, values (same count)   -> kOk
  kAppend = 11,         // key, value                  -> kInteger
  kAppendOnClose = 12,  // key, value, u64 keep-alive ms -> kOk (since v2)
  kAuth = 13,           // token (value)               -> kOk | kError, close
                        // (since v3)
  // Responses (server -> client).
  kOk = 64,        // (empty)
  kValue = 65,     // value
  kValues = 66,    // values
  kInteger = 67,   // i64
  kBool = 68,      // u8 0|1
  kTimedOut = 69,  // u32 key count, list of u32 indices of the missing keys
  kError = 70,     // message (the request failed; the connection stays usable)
};

bool is_request(MsgType type);
bool is_response(MsgType type);
// "set", "get", ... for log lines and error messages; "0x2a" when unknown.
std::string msg_type_name(MsgType type);

enum class DecodeStatus { kOk, kNeedMore, kBad };

struct Hello {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  uint16_t flags = 0;  // kAuthRequired from a server; 0 from a client
};

void encode_hello(const Hello& hello, std::string& out);
// Reads the 8-byte hello from the front of `in` without judging its magic or
// version (the caller reports a mismatch in its own words).
DecodeStatus decode_hello(std::string_view in, Hello& out);

// One frame at the front of a buffer. `body` views the caller's buffer.
struct Frame {
  MsgType type{};
  std::string_view body;
  size_t size = 0;  // header + body: how many bytes to consume
};

// Splits the next frame off the front of `in`. kNeedMore when `in` holds only
// part of it; kBad (with `error` set) when its length exceeds
// `max_body_bytes`. The type is not validated here.
DecodeStatus next_frame(std::string_view in, size_t max_body_bytes, Frame& out,
                        std::string& error);

// A request. Fields unused by `type` are ignored by encode and left empty by
// decode. Views point into the caller's memory; vectors keep their capacity
// across decodes so a reused Request does not allocate per frame.
struct Request {
  MsgType type = MsgType::kSet;
  std::vector<std::string_view> keys;    // one entry for single-key ops
  std::vector<std::string_view> values;  // set/append/auth: 1; compare_set:
                                         // 2 (expected, desired); multi_set: n
  int64_t delta = 0;                     // add
  uint64_t timeout_ms = 0;               // get, wait, multi_get;
                                         // append_on_close: keep-alive
};

// A response; same conventions as Request.
struct Response {
  MsgType type = MsgType::kOk;
  std::vector<std::string_view> values;  // kValue: 1; kValues: n
  int64_t integer = 0;                   // kInteger; kBool: 0 or 1
  uint32_t total_keys = 0;               // kTimedOut: keys waited for
  std::vector<uint32_t> missing;         // kTimedOut: indices not present
  std::string_view message;              // kError
};

// Appends one whole frame to `out`. The request's shape must match its type
// (a broken invariant aborts).
void encode_request(const Request& request, std::string& out);
void encode_response(const Response& response, std::string& out);

// Decodes a frame body. kBad with `error` set for a type of the wrong
// direction, a truncated body, trailing bytes or inconsistent counts; never
// kNeedMore.
DecodeStatus decode_request(const Frame& frame, Request& out,
                            std::string& error);
DecodeStatus decode_response(const Frame& frame, Response& out,
                             std::string& error);

}  // namespace dlaunch::comm::store::wire

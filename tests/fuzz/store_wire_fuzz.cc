// libFuzzer harness for the store's wire protocol (comm/store/wire.h): any
// bytes a peer may send go through the decoders the server and client use.
// Whatever decodes must encode back to the very same frame, and decoding that
// again must give the same fields.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "comm/store/wire.h"

namespace wire = dlaunch::comm::store::wire;

namespace {

// The input's first byte picks the frame-size cap, so the limit's edge is
// reached with small inputs too.
size_t pick_limit(uint8_t b) {
  return b & 1 ? wire::kDefaultMaxFrameBytes : size_t{b};
}

void check(bool ok) {
  if (!ok) std::abort();
}

void request_round_trip(const wire::Frame& frame) {
  wire::Request req;
  std::string err;
  if (wire::decode_request(frame, req, err) != wire::DecodeStatus::kOk) {
    check(!err.empty());
    return;
  }
  check(frame.type == req.type);
  std::string bytes;
  wire::encode_request(req, bytes);
  // Re-encoding reproduces the frame: one encoding per request.
  check(bytes.size() == frame.size);
  wire::Frame again;
  check(wire::next_frame(bytes, wire::kDefaultMaxFrameBytes, again, err) ==
        wire::DecodeStatus::kOk);
  check(again.body == frame.body);
  wire::Request req2;
  check(wire::decode_request(again, req2, err) == wire::DecodeStatus::kOk);
  check(req2.keys == req.keys && req2.values == req.values &&
        req2.delta == req.delta && req2.timeout_ms == req.timeout_ms);
}

void response_round_trip(const wire::Frame& frame) {
  wire::Response resp;
  std::string err;
  if (wire::decode_response(frame, resp, err) != wire::DecodeStatus::kOk) {
    check(!err.empty());
    return;
  }
  check(frame.type == resp.type);
  std::string bytes;
  wire::encode_response(resp, bytes);
  check(bytes.size() == frame.size);
  wire::Frame again;
  check(wire::next_frame(bytes, wire::kDefaultMaxFrameBytes, again, err) ==
        wire::DecodeStatus::kOk);
  check(again.body == frame.body);
  wire::Response resp2;
  check(wire::decode_response(again, resp2, err) == wire::DecodeStatus::kOk);
  check(resp2.values == resp.values && resp2.integer == resp.integer &&
        resp2.total_keys == resp.total_keys && resp2.missing == resp.missing &&
        resp2.message == resp.message);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t limit = pick_limit(data[0]);
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);

  wire::Hello hello;
  if (wire::decode_hello(in, hello) == wire::DecodeStatus::kOk) {
    std::string bytes;
    wire::encode_hello(hello, bytes);
    check(bytes.size() == wire::kHelloBytes);
    // A peer's hello is read whole, then frames follow.
    if (hello.magic == wire::kMagic) in.remove_prefix(wire::kHelloBytes);
  }

  // Every frame of the stream, as a server (requests) and a client
  // (responses) would split and decode them.
  while (!in.empty()) {
    wire::Frame frame;
    std::string err;
    wire::DecodeStatus st = wire::next_frame(in, limit, frame, err);
    if (st == wire::DecodeStatus::kNeedMore) break;
    if (st == wire::DecodeStatus::kBad) {
      check(!err.empty());
      break;
    }
    check(frame.size >= wire::kFrameHeaderBytes && frame.size <= in.size());
    check(frame.body.size() == frame.size - wire::kFrameHeaderBytes);
    if (wire::is_request(frame.type)) request_round_trip(frame);
    if (wire::is_response(frame.type)) response_round_trip(frame);
    // A type of neither direction must be refused by both decoders.
    if (!wire::is_request(frame.type) && !wire::is_response(frame.type)) {
      wire::Request req;
      wire::Response resp;
      check(wire::decode_request(frame, req, err) == wire::DecodeStatus::kBad);
      check(wire::decode_response(frame, resp, err) ==
            wire::DecodeStatus::kBad);
    }
    wire::msg_type_name(frame.type);
    in.remove_prefix(frame.size);
  }
  return 0;
}

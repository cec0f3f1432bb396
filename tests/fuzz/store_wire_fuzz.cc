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

// Decodes `frame` as a Msg (a request or a response); one that decodes must
// re-encode to the very same frame (one encoding per message), which
// decodes again to the same fields.
template <typename Msg, typename Decode, typename Encode, typename Same>
void round_trip(const wire::Frame& frame, Decode decode, Encode encode,
                Same same) {
  Msg msg;
  std::string err;
  if (decode(frame, msg, err) != wire::DecodeStatus::kOk) {
    check(!err.empty());
    return;
  }
  check(frame.type == msg.type);
  std::string bytes;
  encode(msg, bytes);
  check(bytes.size() == frame.size);
  wire::Frame again;
  check(wire::next_frame(bytes, wire::kDefaultMaxFrameBytes, again, err) ==
        wire::DecodeStatus::kOk);
  check(again.body == frame.body);
  Msg msg2;
  check(decode(again, msg2, err) == wire::DecodeStatus::kOk);
  check(same(msg, msg2));
}

void request_round_trip(const wire::Frame& frame) {
  round_trip<wire::Request>(
      frame,
      [](const wire::Frame& f, wire::Request& r, std::string& e) {
        return wire::decode_request(f, r, e);
      },
      [](const wire::Request& r, std::string& out) {
        wire::encode_request(r, out);
      },
      [](const wire::Request& a, const wire::Request& b) {
        return a.keys == b.keys && a.values == b.values && a.delta == b.delta &&
               a.timeout_ms == b.timeout_ms;
      });
}

void response_round_trip(const wire::Frame& frame) {
  round_trip<wire::Response>(
      frame,
      [](const wire::Frame& f, wire::Response& r, std::string& e) {
        return wire::decode_response(f, r, e);
      },
      [](const wire::Response& r, std::string& out) {
        wire::encode_response(r, out);
      },
      [](const wire::Response& a, const wire::Response& b) {
        return a.values == b.values && a.integer == b.integer &&
               a.total_keys == b.total_keys && a.missing == b.missing &&
               a.message == b.message;
      });
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

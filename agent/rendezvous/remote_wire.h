#pragma once

#include <map>
#include <string>
#include <vector>

#include "agent/rendezvous/rendezvous.h"

namespace dlaunch::agent::rendezvous::remote {

// The agent's protocol with a rendezvous helper program (dlaunch-rdzv-etcd),
// over a socket pair: one message per line, fields separated by single
// spaces, each field escaped ("%25" "%20" "%0A" "%0D" for % space LF CR),
// the first field the message's verb:
//   agent -> helper: open K=V...; next NPROC REASON TIMEOUT_MS; watch;
//                    report OUTCOME; cut MS (the cut fault, no answer);
//                    unfinished (whom the exit barrier waits for);
//                    alive (the agent's ping, no answer);
//                    end-of-file: leave (revoke, exit)
//   helper -> agent: ready; round FIELDS... (encode_result);
//                    unfinished NODE... (Rendezvous::unfinished_nodes);
//                    error closed|error TEXT; event KIND ROUND DETAIL; log TEXT
// Version: the open message carries protocol=4 (2 added cut, 3
// unfinished, 4 alive and the agent_silence setting: milliseconds without
// a ping after which the helper stops renewing the lease, 0 never); a
// helper that does not speak it answers with an error.
inline constexpr int kProtocolVersion = 4;

// "a b\n" from {"a", "b"}.
std::string encode_line(const std::vector<std::string>& fields);
// The fields of one line (without its '\n'). Throws std::invalid_argument
// on a malformed escape.
std::vector<std::string> decode_line(const std::string& line);

// A round's result as fields after the verb "round", and back (throws
// std::invalid_argument when fields are missing or not numbers).
std::vector<std::string> encode_result(const RendezvousResult& r);
RendezvousResult decode_result(const std::vector<std::string>& fields);

// KEY=VALUE fields of "open" from a map, and back.
std::vector<std::string> encode_settings(
    const std::map<std::string, std::string>& settings);
std::map<std::string, std::string> decode_settings(
    const std::vector<std::string>& fields);

// The rendezvous options a helper needs, as "open" settings (durations
// in ms, etcd_endpoints comma-separated), and back; decode_options throws
// std::invalid_argument for a missing or malformed number.
std::map<std::string, std::string> encode_options(const RendezvousOptions& o);
RendezvousOptions decode_options(
    const std::map<std::string, std::string>& settings);

// A whole decimal number; throws std::invalid_argument.
int wire_int(const std::string& s);

// The integers the enums travel as.
int to_wire(RoundReason reason);
RoundReason reason_from_wire(int v);
int to_wire(RoundEvent::Kind kind);
RoundEvent::Kind kind_from_wire(int v);
int to_wire(NodeOutcome outcome);
NodeOutcome outcome_from_wire(int v);

}  // namespace dlaunch::agent::rendezvous::remote

#include "agent/rendezvous/remote_wire.h"

#include <charconv>
#include <sstream>
#include <stdexcept>

namespace dlaunch::agent::rendezvous::remote {

int wire_int(const std::string& s) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) {
    throw std::invalid_argument("'" + s + "' is not a number");
  }
  return v;
}

namespace {

int checked(int v, int hi, const char* what) {
  if (v < 0 || v > hi) {
    throw std::invalid_argument(std::string("bad ") + what + " " +
                                std::to_string(v));
  }
  return v;
}

}  // namespace

std::string encode_line(const std::vector<std::string>& fields) {
  std::string out;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) out += ' ';
    for (char c : fields[i]) {
      switch (c) {
        case '%':
          out += "%25";
          break;
        case ' ':
          out += "%20";
          break;
        case '\n':
          out += "%0A";
          break;
        case '\r':
          out += "%0D";
          break;
        default:
          out += c;
      }
    }
  }
  return out + "\n";
}

std::vector<std::string> decode_line(const std::string& line) {
  std::vector<std::string> out(1);
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (c == ' ') {
      out.emplace_back();
    } else if (c == '%') {
      const std::string code = line.substr(i + 1, 2);
      if (code == "25")
        out.back() += '%';
      else if (code == "20")
        out.back() += ' ';
      else if (code == "0A")
        out.back() += '\n';
      else if (code == "0D")
        out.back() += '\r';
      else
        throw std::invalid_argument("bad escape '%" + code + "' in '" + line +
                                    "'");
      i += 2;
    } else {
      out.back() += c;
    }
  }
  return out;
}

std::vector<std::string> encode_result(const RendezvousResult& r) {
  std::vector<std::string> f = {std::to_string(r.round),
                                std::to_string(r.group_rank),
                                std::to_string(r.group_world_size),
                                std::to_string(r.world_size),
                                std::to_string(r.rank_offset),
                                r.master_addr,
                                std::to_string(r.master_port),
                                std::to_string(r.restart_count),
                                std::to_string(to_wire(r.reason)),
                                r.restart_cause};
  f.insert(f.end(), r.members.begin(), r.members.end());
  return f;
}

RendezvousResult decode_result(const std::vector<std::string>& f) {
  if (f.size() < 10) {
    throw std::invalid_argument(
        "a round needs 10 fields and the members, got " +
        std::to_string(f.size()));
  }
  RendezvousResult r;
  r.round = wire_int(f[0]);
  r.group_rank = wire_int(f[1]);
  r.group_world_size = wire_int(f[2]);
  r.world_size = wire_int(f[3]);
  r.rank_offset = wire_int(f[4]);
  r.master_addr = f[5];
  r.master_port = wire_int(f[6]);
  r.restart_count = wire_int(f[7]);
  r.reason = reason_from_wire(wire_int(f[8]));
  r.restart_cause = f[9];
  r.members.assign(f.begin() + 10, f.end());
  if (static_cast<int>(r.members.size()) != r.group_world_size) {
    throw std::invalid_argument("a round of " + f[2] + " nodes lists " +
                                std::to_string(r.members.size()));
  }
  return r;
}

std::vector<std::string> encode_settings(
    const std::map<std::string, std::string>& settings) {
  std::vector<std::string> f;
  for (const auto& [k, v] : settings) f.push_back(k + "=" + v);
  return f;
}

std::map<std::string, std::string> decode_settings(
    const std::vector<std::string>& fields) {
  std::map<std::string, std::string> out;
  for (const std::string& kv : fields) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos) {
      throw std::invalid_argument("'" + kv + "' is not KEY=VALUE");
    }
    out[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return out;
}

std::map<std::string, std::string> encode_options(const RendezvousOptions& o) {
  auto ms = [](std::chrono::milliseconds d) {
    return std::to_string(d.count());
  };
  std::string endpoints;
  for (const std::string& e : o.etcd_endpoints) {
    endpoints += (endpoints.empty() ? "" : ",") + e;
  }
  return {
      {"backend", o.backend},
      {"min_nodes", std::to_string(o.min_nodes)},
      {"max_nodes", std::to_string(o.max_nodes)},
      {"node_rank", std::to_string(o.node_rank)},
      {"endpoints", endpoints},
      {"cacert", o.cacert},
      {"cert", o.cert},
      {"key", o.key},
      {"user", o.user},
      {"password_file", o.password_file},
      {"join_timeout_ms", ms(o.join_timeout)},
      {"last_call_timeout_ms", ms(o.last_call_timeout)},
      {"close_timeout_ms", ms(o.close_timeout)},
      {"keep_alive_interval_ms", ms(o.keep_alive_interval)},
      {"keep_alive_max_attempt", std::to_string(o.keep_alive_max_attempt)},
      {"read_timeout_ms", ms(o.read_timeout)},
  };
}

RendezvousOptions decode_options(const std::map<std::string, std::string>& s) {
  auto text = [&s](const std::string& key) {
    auto it = s.find(key);
    return it == s.end() ? std::string() : it->second;
  };
  auto number = [&](const std::string& key) {
    auto it = s.find(key);
    if (it == s.end()) {
      throw std::invalid_argument("the setting '" + key + "' is missing");
    }
    return wire_int(it->second);
  };
  auto ms = [&](const std::string& key) {
    return std::chrono::milliseconds(number(key));
  };
  RendezvousOptions o;
  o.backend = text("backend");
  o.min_nodes = number("min_nodes");
  o.max_nodes = number("max_nodes");
  o.node_rank = number("node_rank");
  std::string item;
  std::istringstream in(text("endpoints"));
  while (std::getline(in, item, ',')) {
    if (!item.empty()) o.etcd_endpoints.push_back(item);
  }
  o.cacert = text("cacert");
  o.cert = text("cert");
  o.key = text("key");
  o.user = text("user");
  o.password_file = text("password_file");
  o.join_timeout = ms("join_timeout_ms");
  o.last_call_timeout = ms("last_call_timeout_ms");
  o.close_timeout = ms("close_timeout_ms");
  o.keep_alive_interval = ms("keep_alive_interval_ms");
  o.keep_alive_max_attempt = number("keep_alive_max_attempt");
  o.read_timeout = ms("read_timeout_ms");
  return o;
}

int to_wire(RoundReason reason) { return static_cast<int>(reason); }
RoundReason reason_from_wire(int v) {
  return static_cast<RoundReason>(
      checked(v, static_cast<int>(RoundReason::kNodeJoined), "reason"));
}
int to_wire(RoundEvent::Kind kind) { return static_cast<int>(kind); }
RoundEvent::Kind kind_from_wire(int v) {
  return static_cast<RoundEvent::Kind>(
      checked(v, static_cast<int>(RoundEvent::Kind::kFatal), "event kind"));
}
int to_wire(NodeOutcome outcome) { return static_cast<int>(outcome); }
NodeOutcome outcome_from_wire(int v) {
  return static_cast<NodeOutcome>(
      checked(v, static_cast<int>(NodeOutcome::kGaveUp), "outcome"));
}

}  // namespace dlaunch::agent::rendezvous::remote

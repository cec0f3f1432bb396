#include "agent/rendezvous/member.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <sstream>

#include "comm/store/text.h"

namespace dlaunch::agent::rendezvous {

namespace {

int to_int(const std::string& s) {
  int v = -1;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() ? v : -1;
}

}  // namespace

std::string MemberRecord::encode() const {
  return id + "\n" + addr + "\n" + std::to_string(nproc) + "\n" +
         std::to_string(prev_round) + "\n" + std::to_string(prev_rank) + "\n" +
         std::to_string(restarts) + "\n" + std::to_string(master_port) + "\n" +
         std::to_string(node_rank) + "\n" + std::to_string(min_nodes) + "\n" +
         std::to_string(max_nodes);
}

std::vector<std::string> split_list(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

MemberRecord MemberRecord::decode(const std::string& text, int seq) {
  std::vector<std::string> f = split_list(text, '\n');
  if (f.size() != 10) {
    throw RendezvousError("malformed join record '" + text +
                          "' in the store (another dlaunch version?)");
  }
  return MemberRecord{f[0],         f[1],         to_int(f[2]), to_int(f[3]),
                      to_int(f[4]), to_int(f[5]), to_int(f[6]), to_int(f[7]),
                      to_int(f[8]), to_int(f[9]), seq};
}

std::string nnodes_conflict(const MemberRecord& me, const MemberRecord& other) {
  if (me.min_nodes == other.min_nodes && me.max_nodes == other.max_nodes) {
    return "";
  }
  auto text = [](const MemberRecord& m) {
    return m.min_nodes == m.max_nodes ? std::to_string(m.max_nodes)
                                      : std::to_string(m.min_nodes) + ":" +
                                            std::to_string(m.max_nodes);
  };
  return "this node (" + me.addr + ") gives --nnodes " + text(me) + ", node " +
         other.addr + " of the same job --nnodes " + text(other) +
         "; give every node of the job the same --nnodes";
}

MemberRecord join_record(const NodeParams& p, const std::string& id, int nproc,
                         int prev_round, int prev_rank, int restarts) {
  MemberRecord me;
  me.id = id;
  me.addr = p.node_addr;
  me.nproc = nproc;
  me.prev_round = prev_round;
  me.prev_rank = prev_rank;
  me.restarts = restarts;
  me.master_port =
      p.master_port != 0 ? p.master_port : p.pick_port(p.node_addr);
  me.node_rank = p.options.node_rank;
  me.min_nodes = p.options.min_nodes;
  me.max_nodes = p.options.max_nodes;
  return me;
}

RendezvousResult form_round(int round, std::vector<MemberRecord>& ms,
                            const std::string& self_id, RoundReason reason,
                            bool fixed) {
  const int n = static_cast<int>(ms.size());
  // Nodes that joined at once (neither saw the other's record first).
  for (const MemberRecord& me : ms) {
    if (me.id != self_id) continue;
    for (const MemberRecord& m : ms) {
      if (std::string e = nnodes_conflict(me, m); !e.empty()) {
        throw RendezvousError(e);
      }
    }
  }
  if (fixed) {
    std::sort(ms.begin(), ms.end(),
              [](const MemberRecord& a, const MemberRecord& b) {
                return a.node_rank < b.node_rank;
              });
    for (int i = 0; i < n; ++i) {
      if (ms[i].node_rank != i) {
        throw RendezvousError(
            "the static backend needs --node-rank 0.." + std::to_string(n - 1) +
            " once each; got " + std::to_string(ms[i].node_rank) + " from " +
            ms[i].addr + (i > 0 ? " after " + ms[i - 1].addr : std::string()));
      }
    }
  } else {
    // Stable ranks: members of the previous round keep their order.
    auto order = [round](const MemberRecord& m) {
      return std::make_pair(
          m.prev_round == round - 1 && m.prev_rank >= 0 ? m.prev_rank : INT_MAX,
          m.seq);
    };
    std::stable_sort(ms.begin(), ms.end(),
                     [&](const MemberRecord& a, const MemberRecord& b) {
                       return order(a) < order(b);
                     });
  }
  RendezvousResult res;
  res.round = round;
  res.group_world_size = n;
  res.reason = reason;
  res.world_size = 0;
  res.restart_count = 0;
  for (int i = 0; i < n; ++i) {
    if (ms[i].id == self_id) {
      res.group_rank = i;
      res.rank_offset = res.world_size;
    }
    res.world_size += ms[i].nproc;
    res.restart_count = std::max(res.restart_count, ms[i].restarts);
    res.members.push_back(ms[i].addr);
  }
  res.master_addr = ms[0].addr;
  res.master_port = ms[0].master_port;
  return res;
}

std::string round_line(const RendezvousResult& r) {
  std::string names;
  for (const std::string& m : r.members) {
    names += (names.empty() ? "" : ", ") + m;
  }
  return "dlaunch: round " + std::to_string(r.round) + " (" +
         reason_name(r.reason) + "): " + std::to_string(r.group_world_size) +
         " nodes [" + names + "], this node is group rank " +
         std::to_string(r.group_rank) + ", " + std::to_string(r.world_size) +
         " workers\n";
}

std::string waiting_line(int joined, int target, const RendezvousOptions& o,
                         std::chrono::milliseconds call_left) {
  std::string line = "dlaunch: waiting for nodes: " + std::to_string(joined) +
                     "/" + std::to_string(target) + " joined (min " +
                     std::to_string(o.min_nodes) + ", max " +
                     std::to_string(o.max_nodes) + ")";
  if (call_left.count() >= 0) {
    line += ", last call ends in " + comm::store::format_duration(call_left);
  }
  return line + "\n";
}

std::string too_few_message(int joined, int round, const std::string& run_id,
                            const std::string& where,
                            std::chrono::milliseconds waited,
                            const RendezvousOptions& o,
                            const std::vector<std::string>& joiners,
                            const std::vector<std::string>& lost) {
  std::string who;
  for (const std::string& j : joiners) who += (who.empty() ? "" : ", ") + j;
  std::string gone;
  for (const std::string& j : lost) gone += (gone.empty() ? "" : ", ") + j;
  if (!gone.empty()) who += "; lost while waiting: " + gone;
  return std::to_string(joined) + "/" + std::to_string(o.min_nodes) +
         " nodes joined round " + std::to_string(round) + " of job '" + run_id +
         "' at " + where + " after " + comm::store::format_duration(waited) +
         " (min " + std::to_string(o.min_nodes) + ", max " +
         std::to_string(o.max_nodes) + "; joined: " + who +
         "); start the missing nodes or lower --nnodes";
}

std::string late_line(int round, int members, int max_nodes) {
  return "dlaunch: round " + std::to_string(round) + " is running with " +
         std::to_string(members) + " nodes" +
         (members < max_nodes ? "; it restarts to take this node in\n"
                              : " (the most allowed); waiting for a place\n");
}

std::string finished_message(const std::string& run_id) {
  return "the job '" + run_id +
         "' already finished (its rendezvous is closed); nothing to do";
}

std::string gave_up_message(const std::string& run_id) {
  return "the job '" + run_id +
         "' already failed: its nodes used every restart --max-restarts "
         "allows and gave up, so this node has no group to join; start the "
         "job again with a new --rdzv-id";
}

std::vector<std::string> unfinished_members(
    const std::vector<std::string>& ids, const std::vector<std::string>& addrs,
    const std::set<std::string>& done) {
  std::vector<std::string> out;
  for (size_t i = 0; i < ids.size() && i < addrs.size(); ++i) {
    if (!done.contains(ids[i])) {
      out.push_back(addrs[i] + " (group rank " + std::to_string(i) + ")");
    }
  }
  return out;
}

}  // namespace dlaunch::agent::rendezvous

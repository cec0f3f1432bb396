#include "agent/fault.h"

#include "agent/env.h"
#include "comm/fault_spec.h"

namespace dlaunch::agent {

using comm::FaultSpec;

Fault parse_fault(std::string_view text) {
  FaultSpec s(text);
  Fault f;
  const std::string& kind = s.kind();
  if (kind == "kill") {
    f.kind = Fault::Kind::kKill;
    s.allow({"rank", "signal", "after", "attempt"});
  } else if (kind == "exit") {
    f.kind = Fault::Kind::kExit;
    s.allow({"rank", "code", "after", "attempt"});
  } else if (kind == "stop") {
    f.kind = Fault::Kind::kStop;
    s.allow({"rank", "after", "attempt"});
  } else if (kind == "kill-agent") {
    f.kind = Fault::Kind::kKillAgent;
    s.allow({"node", "signal", "after", "attempt"});
  } else if (kind == "cut") {
    f.kind = Fault::Kind::kCut;
    s.allow({"node", "for", "after", "attempt"});
  } else {
    s.fail("unknown kind '" + kind +
           "'; use kill, exit, stop, kill-agent or cut (see dlaunch --help)");
  }
  if (f.kind == Fault::Kind::kKillAgent || f.kind == Fault::Kind::kCut) {
    s.require("node", kind + ":node=1");
    f.node = *s.integer("node", 0, 1 << 20);
  } else {
    s.require("rank", kind + ":rank=1");
    f.rank = *s.integer("rank", 0, 1 << 24);
  }
  if (f.kind == Fault::Kind::kCut) {
    s.require("for", "cut:node=1:for=20");
    f.duration = *s.seconds("for");
    if (f.duration.count() == 0) s.fail("for=0 cuts nothing; use seconds > 0");
  }
  f.after = s.seconds("after").value_or(f.after);
  f.attempt = s.integer("attempt", 0, 1 << 20).value_or(0);
  f.signal = s.signal("signal").value_or(SIGKILL);
  f.code = s.integer("code", 0, 255).value_or(1);
  if (f.kind == Fault::Kind::kExit && f.code == 0) {
    s.fail("code=0 is not a failure; use a code 1..255");
  }

  f.spec = kind + (f.node >= 0 ? ":node=" + std::to_string(f.node)
                               : ":rank=" + std::to_string(f.rank));
  if (f.signal != SIGKILL)
    f.spec += ":signal=" + FaultSpec::signal_text(f.signal);
  if (f.kind == Fault::Kind::kExit && f.code != 1) {
    f.spec += ":code=" + std::to_string(f.code);
  }
  if (f.kind == Fault::Kind::kCut) {
    f.spec += ":for=" + FaultSpec::seconds_text(f.duration);
  }
  if (f.after.count() != 0)
    f.spec += ":after=" + FaultSpec::seconds_text(f.after);
  if (f.attempt != 0) f.spec += ":attempt=" + std::to_string(f.attempt);
  return f;
}

std::vector<Fault> parse_faults(const std::vector<std::string>& texts) {
  std::vector<Fault> out;
  for (const std::string& t : texts) {
    Fault f = parse_fault(t);
    for (const Fault& g : out) {
      if (g.spec == f.spec) {
        throw comm::FaultSpecError(
            "fault '" + t + "': the same fault as '" + g.spec +
            "' is given twice (faults from --fault, the job file's faults: "
            "and DLAUNCH_FAULTS add up); drop one");
      }
    }
    out.push_back(std::move(f));
  }
  return out;
}

std::string fault_out_of_range(const Fault& f, int world_size, int nodes) {
  if (f.targets_rank() && f.rank >= world_size) {
    return "rank " + std::to_string(f.rank) +
           " is out of range: " + std::to_string(world_size) +
           " workers (ranks 0.." + std::to_string(world_size - 1) + ")";
  }
  if (!f.targets_rank() && f.node >= nodes) {
    return "node " + std::to_string(f.node) +
           " is out of range: " + std::to_string(nodes) + " node(s) (0.." +
           std::to_string(nodes - 1) + ")";
  }
  return "";
}

std::string fault_action(const Fault& f) {
  switch (f.kind) {
    case Fault::Kind::kKill:
      return signal_name(f.signal) + " to rank " + std::to_string(f.rank);
    case Fault::Kind::kExit:
      return "rank " + std::to_string(f.rank) + " ended as exit code " +
             std::to_string(f.code);
    case Fault::Kind::kStop:
      return "SIGSTOP to rank " + std::to_string(f.rank) + " (frozen)";
    case Fault::Kind::kKillAgent:
      return signal_name(f.signal) + " to the agent of node " +
             std::to_string(f.node);
    case Fault::Kind::kCut:
      return "node " + std::to_string(f.node) +
             " silent to the agents' store for " +
             FaultSpec::seconds_text(f.duration) + " s";
  }
  return "";
}

}  // namespace dlaunch::agent

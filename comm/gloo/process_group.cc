// Group set-up (connect, new_group, create_process_group) and failure
// handling (fail()). Which file holds which path: comm/README.md.

#include "comm/gloo/process_group.h"

#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "comm/gloo/gloo_group.h"
#include "comm/say.h"
#include "comm/shm_names.h"

namespace dlaunch::comm::gloo {
namespace {

namespace tcp = ::gloo::transport::tcp;

// A byte count from the environment, or `fallback` when unset; "off" is
// `off` (for a threshold: the largest value, never; for a budget: 0).
size_t env_bytes(const char* name, size_t fallback, size_t off) {
  const char* f = std::getenv(name);
  if (f == nullptr || *f == '\0') return fallback;
  if (std::string_view(f) == "off") return off;
  char* end = nullptr;
  unsigned long long v = std::strtoull(f, &end, 10);
  if (end == f || *end != '\0' || v > (1ull << 40)) {
    throw CommError(std::string(name) + " is '" + f +
                    "'; expected a byte count (e.g. 1048576) or 'off'");
  }
  return static_cast<size_t>(v);
}

// This machine's boot id and host name: ranks with equal identities share
// /dev/shm. Test-only: DLAUNCH_COMM_TEST_HOSTS="a,a,b,b" appends entry
// `rank` of the list, so that one machine plays several hosts.
std::string host_identity(int rank) {
  std::string suffix;
  if (const char* test = std::getenv("DLAUNCH_COMM_TEST_HOSTS")) {
    std::string list = std::string(test) + ",";
    size_t pos = 0;
    for (int i = 0; i < rank && pos != std::string::npos; ++i) {
      pos = list.find(',', pos);
      if (pos != std::string::npos) ++pos;
    }
    if (pos != std::string::npos && pos < list.size()) {
      suffix = "/test:" + list.substr(pos, list.find(',', pos) - pos);
    }
  }
  std::string id;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof(buf), f)) id = buf;
    std::fclose(f);
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return id + "/" + host + suffix;
}

std::string random_token() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%08x%08x", rd(), rd());
  return buf;
}

// attempt_shm_prefix() of this worker's attempt when an agent (dlaunch,
// torchrun) started it, so that its agent can remove the segments of ranks
// killed mid-set-up; "" otherwise.
std::string agent_shm_prefix() {
  const char* names[] = {"TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                         "MASTER_ADDR", "MASTER_PORT"};
  const char* v[4];
  for (int i = 0; i < 4; ++i) {
    v[i] = std::getenv(names[i]);
    if (v[i] == nullptr) return "";
  }
  return attempt_shm_prefix(v[0], v[1], v[2], v[3]);
}

// Gloo writes to its sockets without MSG_NOSIGNAL: a write to a peer that
// just died raises SIGPIPE, whose default action kills the process without
// a word, before the error could be reported. Ignore it, as Python (and so
// torch) does, unless the program installed its own handling.
void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      struct sigaction ign {};
      ign.sa_handler = SIG_IGN;
      sigemptyset(&ign.sa_mask);
      sigaction(SIGPIPE, &ign, nullptr);
    }
  });
}

}  // namespace

std::unique_ptr<ProcessGroup> GlooProcessGroup::new_group(
    const std::vector<int>& ranks, milliseconds timeout) {
  const char* op = "new_group";
  Call c =
      make_call(Op::kNewGroup, DType::kF32, ranks.size(), -1, ReduceOp::kSum);
  uint64_t h = 1469598103934665603ull;
  for (int r : ranks) h = (h ^ static_cast<uint64_t>(r)) * 1099511628211ull;
  c.extra = h;
  if (ranks.empty()) c.local_error = "new_group needs at least one rank. ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size()) {
      c.local_error += "new_group rank " + std::to_string(ranks[i]) +
                       " is out of range for " + g_->where() + " (valid: 0.." +
                       std::to_string(size() - 1) + "). ";
    } else if (i > 0 && ranks[i] <= ranks[i - 1]) {
      c.local_error += "new_group ranks must be sorted and distinct; " +
                       std::to_string(ranks[i]) + " follows " +
                       std::to_string(ranks[i - 1]) + ". ";
    }
  }
  if (timeout.count() <= 0 || timeout > kMaxTimeout) {
    c.local_error += "new_group timeout is " + std::to_string(timeout.count()) +
                     " ms; it must be from " + kTimeoutRangeText + ". ";
  }
  agree(op, c);
  // Test-only: this rank of the parent exits here, between the check and
  // the connections (a death the parent's check cannot see).
  if (const char* r = std::getenv("DLAUNCH_COMM_TEST_EXIT_IN_NEW_GROUP");
      r != nullptr && std::atoi(r) == rank()) {
    ::_exit(7);
  }
  std::string child = g_->name + "/" + std::to_string(++children_);
  auto it = std::find(ranks.begin(), ranks.end(), rank());
  if (it == ranks.end()) return nullptr;
  GroupOptions o;
  o.rank = static_cast<int>(it - ranks.begin());
  o.size = static_cast<int>(ranks.size());
  o.timeout = timeout;
  o.name = child;
  o.hostname = g_->hostname;
  o.iface = g_->iface;
  // A member that dies meanwhile (its connection to this group fails)
  // ends the others' wait at once, named; they waited the whole timeout.
  auto gone = [this, ranks]() -> std::string {
    std::string who;
    for (int r : g_->failed_peers()) {
      if (std::binary_search(ranks.begin(), ranks.end(), r)) {
        who += (who.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    if (who.empty()) return who;
    return "rank " + who + " of group '" + g_->name +
           "' left (it failed or exited) while this group was being created";
  };
  return joined(connect(o, g_->store, g_->host, gone));
}

void GlooProcessGroup::fail(const char* op, const std::string& what,
                            const std::vector<int>& missing,
                            const std::vector<int>& gone, bool timed_out) {
  failed_missing_ = missing;
  const std::vector<int> failed = !gone.empty() ? gone
                                  : missing.empty() && !timed_out
                                      ? g_->failed_peers()
                                      : std::vector<int>{};
  const int peer = failed.size() == 1 ? failed[0] : -1;
  std::string msg = std::string(op) + " on " + g_->where() + " failed: ";
  if (!missing.empty()) {
    msg += "timed out after " + ms_text(timeout()) + " waiting for " +
           rank_list(missing) + " to call " + op + " (" +
           std::to_string(size() - 1 - missing.size()) + "/" +
           std::to_string(size() - 1) + " peers arrived)";
  } else if (!gone.empty()) {
    msg += rank_list(gone) + (gone.size() == 1 ? " has" : " have") +
           " left the group while this rank waited for it (it failed, "
           "exited or destroyed the group)";
  } else if (peer >= 0) {
    msg += "connection to rank " + std::to_string(peer) + " lost";
  } else if (!failed.empty()) {
    msg += "connections to " + rank_list(failed) + " lost";
  } else if (timed_out) {
    msg += "timed out after " + ms_text(timeout()) +
           " waiting for the other ranks (none reported a failure)";
  } else {
    msg += "transport error";
  }
  // The first failure, for every rank to report (the root cause, where
  // later failures are ranks leaving because of it). Ranks sharing a
  // host keep it in the channel, which outlives the store: a rank 0 that
  // saw a peer die and left took its store down with it.
  const std::string mine = "rank " + std::to_string(rank()) + ": " + msg;
  std::string cause;
  if (channel_) {
    if (!channel_->record_failure(mine)) cause = channel_->first_failure();
  } else {
    const std::string abort_key = g_->name + "/abort";
    try {
      std::lock_guard lock(g_->store->mu);
      auto& s = *g_->store->store;
      if (s.check({abort_key})) cause = s.get(abort_key);
      if (cause.empty()) s.compare_set(abort_key, "", mine);
    } catch (const std::exception&) {
      // The store may have died with the failed peer; the message stands.
    }
  }
  if (!cause.empty()) msg += " (first failure, " + cause + ")";
  msg += " [gloo: " + what + "]";
  {
    std::lock_guard lock(g_->mu);
    if (g_->broken.empty()) g_->broken = msg;
  }
  // Told before the peers can learn of it (closing the connections below):
  // once they fail too, the agent may stop this process before the caller
  // prints the CommError.
  say(msg);
  g_->ctx->closeConnections();
  if (channel_) channel_->close();  // peers waiting in shared memory too
  if (g_->p2p) g_->p2p->close(msg);
  if (!missing.empty() || (timed_out && peer < 0)) {
    throw CommTimeoutError(msg);
  }
  throw CommError(msg);
}

// The group over a connected mesh, returned once every rank has finished
// connecting: a rank that destroyed its group the moment it was created
// would otherwise close pairs that a slower rank is still setting up.
std::unique_ptr<ProcessGroup> GlooProcessGroup::joined(
    std::shared_ptr<GroupState> g) {
  auto pg = std::make_unique<GlooProcessGroup>(std::move(g));
  pg->barrier();
  pg->setup_shm_p2p();
  return pg;
}

std::shared_ptr<GroupState> GlooProcessGroup::connect(
    const GroupOptions& o, std::shared_ptr<SharedStore> s,
    const std::string& host, std::function<std::string()> abandon) {
  auto g = std::make_shared<GroupState>();
  g->name = o.name;
  g->rank = o.rank;
  g->size = o.size;
  g->timeout = o.timeout;
  g->store = std::move(s);
  g->hostname = o.hostname;
  g->iface = o.iface;
  // "off" fuses nothing, as 0 does (SIZE_MAX would fuse everything).
  g->fused_bytes =
      env_bytes("DLAUNCH_COMM_FUSED_BYTES", kFusedTrafficBytes, /*off=*/0);
  g->shm_min_bytes =
      env_bytes("DLAUNCH_COMM_SHM_MIN_BYTES", kShmMinBytes, /*off=*/SIZE_MAX);
  // Read again when the channel opens (cma_allowed); a typo there would
  // turn it off without a word.
  if (const char* cma = std::getenv("DLAUNCH_COMM_CMA");
      cma != nullptr && *cma != '\0' && std::string_view(cma) != "on" &&
      std::string_view(cma) != "off") {
    throw CommError(std::string("DLAUNCH_COMM_CMA is '") + cma +
                    "'; expected on or off (default off)");
  }
  const std::string where = "creating " + g->where();
  try {
    tcp::attr attr;
    if (o.iface.empty()) {
      attr.hostname = o.hostname;
    } else {
      attr.iface = o.iface;
    }
    g->device = tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw CommError(where + ": cannot listen on " +
                    (o.iface.empty() ? "host '" + o.hostname + "'"
                                     : "interface '" + o.iface + "'") +
                    " (set GLOO_SOCKET_IFNAME or MASTER_ADDR to an address "
                    "of this machine): " +
                    e.what());
  }
  g->ctx = std::make_shared<::gloo::rendezvous::Context>(o.rank, o.size);
  g->ctx->setTimeout(o.timeout);
  StoreAdapter adapter(g->store, o.name, o.timeout, std::move(abandon));
  try {
    g->ctx->connectFullMesh(adapter, g->device);
  } catch (const store::StoreTimeoutError& e) {
    throw CommTimeoutError(where + ": not every rank joined within " +
                           ms_text(o.timeout) + ": " + e.what());
  } catch (const std::exception& e) {
    throw CommError(where +
                    ": connecting to the other ranks failed: " + e.what());
  }
  if (o.size > 1) {
    // Destroyed first among g's members (declared last), so `raw` outlives it.
    GroupState* raw = g.get();
    g->watch = std::make_unique<ConnectionWatch>(
        g->ctx, o.rank, o.size, kWatchSlot << 56,
        [raw](const std::vector<int>& ranks, const std::string& what) {
          raw->connections_lost(ranks, what);
        });
  }
  // Rank 0's tuning holds for every rank (their choices must agree), and
  // ranks that all share this host get a token naming their shared memory.
  try {
    auto put = [&](const std::string& k, const std::string& v) {
      adapter.set(k, std::vector<char>(v.begin(), v.end()));
    };
    auto take = [&](const std::string& k) {
      auto v = adapter.get(k);
      return std::string(v.begin(), v.end());
    };
    // Sub-groups keep their parent's identity (the test override is
    // indexed by the world's ranks).
    const std::string me = host.empty() ? host_identity(o.rank) : host;
    g->host = me;
    g->hosts.assign(o.size, me);
    put("host/" + std::to_string(o.rank), me);
    if (o.rank == 0) {
      put("tuning", std::to_string(g->fused_bytes) + " " +
                        std::to_string(g->shm_min_bytes) + " " +
                        agent_shm_prefix() + random_token());
    }
    std::string tuning = take("tuning");
    unsigned long long fused = 0, shm_min = 0;
    char token[64] = {};
    if (std::sscanf(tuning.c_str(), "%llu %llu %63s", &fused, &shm_min,
                    token) != 3) {
      throw CommError(where + ": rank 0 published bad tuning '" + tuning + "'");
    }
    g->fused_bytes = static_cast<size_t>(fused);
    g->shm_min_bytes = static_cast<size_t>(shm_min);
    g->shm_token = token;
    g->all_local = true;
    for (int j = 0; j < o.size; ++j) {
      if (j == o.rank) continue;
      g->hosts[j] = take("host/" + std::to_string(j));
      if (g->hosts[j] != me) g->all_local = false;
    }
  } catch (const store::StoreError& e) {
    throw CommError(where +
                    ": exchanging host information failed: " + e.what());
  }
  return g;
}

std::string last_path(const ProcessGroup& group) {
  auto* g = dynamic_cast<const GlooProcessGroup*>(&group);
  return g ? g->path() : "";
}

std::vector<int> lost_peers(const ProcessGroup& group) {
  auto* g = dynamic_cast<const GlooProcessGroup*>(&group);
  return g ? g->lost_peers() : std::vector<int>{};
}

std::unique_ptr<ProcessGroup> create_process_group(const GroupOptions& o) {
  ignore_sigpipe_once();
  if (!o.store) throw CommError("gloo::create_process_group: no store given");
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    throw CommError(
        "gloo::create_process_group: rank " + std::to_string(o.rank) +
        " is out of range for world size " + std::to_string(o.size) +
        " (need world size >= 1 and 0 <= rank < world size)");
  }
  if (o.timeout.count() <= 0 || o.timeout > kMaxTimeout) {
    throw CommError("gloo::create_process_group: timeout is " +
                    std::to_string(o.timeout.count()) +
                    " ms; it must be from " + kTimeoutRangeText);
  }
  auto shared = std::make_shared<SharedStore>();
  shared->store = o.store;
  shared->thread_safe = o.store_thread_safe;
  shared->clone = o.store_clone;
  shared->owned = o.owned;
  return GlooProcessGroup::joined(
      GlooProcessGroup::connect(o, std::move(shared)));
}

}  // namespace dlaunch::comm::gloo

#include "launcher/job_token.h"

#include "comm/store/resolve.h"
#include "comm/store/token.h"

namespace dlaunch::launcher {

namespace store = comm::store;

JobToken job_token(const agent::rendezvous::RendezvousOptions& rdzv,
                   const agent::EnvMap& env) {
  JobToken t;
  if (!rdzv.token_file.empty()) {
    t.job = store::read_token_file(rdzv.token_file);
  } else if (auto it = env.find(store::kTokenEnv); it != env.end()) {
    t.job = store::token_from_env(it->second.c_str()).value_or("");
  }
  t.workers = t.job;
  if (t.workers.empty() && rdzv.max_nodes == 1) {
    t.workers = store::random_token();
  }
  return t;
}

std::optional<std::string> tokenless_warning(
    const agent::rendezvous::RendezvousOptions& rdzv, const JobToken& token) {
  if (!token.job.empty() || rdzv.endpoint_host.empty() ||
      store::is_loopback(rdzv.endpoint_host)) {
    return std::nullopt;
  }
  return "dlaunch: warning: the agents' store at " + rdzv.endpoint_host + ":" +
         std::to_string(rdzv.endpoint_port) +
         " serves the network and this job has no token: anyone who reaches "
         "it can join the job or read and change its keys, and so can the "
         "workers' store; make one token (openssl rand -hex 32) and give "
         "every node the same in " +
         std::string(store::kTokenEnv) +
         " or a 0600 file named by --rdzv-conf token_file=PATH\n";
}

}  // namespace dlaunch::launcher

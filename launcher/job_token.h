#pragma once

#include <optional>
#include <string>

#include "agent/rendezvous/rendezvous.h"
#include "agent/worker_env.h"

namespace dlaunch::launcher {

// The job's store token as this agent sees it (docs/store.md,
// "Authentication"). `job` is what the agents' store and every connection
// to it use (empty: none); `workers` is what the agent puts in its workers'
// DLAUNCH_RDZV_TOKEN for their env:// store: the job's, or for a one-node
// job without one a fresh random token (no other node needs to know it).
struct JobToken {
  std::string job;
  std::string workers;
};

// Reads --rdzv-conf token_file= (checked: 0600, valid form), else
// $DLAUNCH_RDZV_TOKEN from `env`. Throws comm::store::TokenError with the
// source and the fix; never puts the token in a message.
JobToken job_token(const agent::rendezvous::RendezvousOptions& rdzv,
                   const agent::EnvMap& env);

// The warning for a rendezvous whose store other machines can reach while
// the job has no token (a manual multi-node run started without one):
// anyone who reaches the store can join or read the job. nullopt when the
// job has a token or its store is loopback-only.
std::optional<std::string> tokenless_warning(
    const agent::rendezvous::RendezvousOptions& rdzv, const JobToken& token);

}  // namespace dlaunch::launcher

#include "agent/worker_env.h"

#include <unistd.h>

extern char** environ;

namespace dlaunch::agent {

EnvMap current_environment() {
  EnvMap env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return env;
}

std::vector<std::string> worker_environment(const EnvMap& base,
                                            const WorkerIdentity& id,
                                            const JobInfo& job,
                                            const std::string& error_file) {
  EnvMap env = base;
  auto set = [&env](const char* k, std::string v) { env[k] = std::move(v); };
  set("LOCAL_RANK", std::to_string(id.local_rank));
  set("RANK", std::to_string(id.rank));
  set("GROUP_RANK", std::to_string(id.group_rank));
  set("ROLE_RANK", std::to_string(id.role_rank));
  set("ROLE_NAME", job.role);
  set("LOCAL_WORLD_SIZE", std::to_string(id.local_world_size));
  set("WORLD_SIZE", std::to_string(id.world_size));
  set("GROUP_WORLD_SIZE", std::to_string(id.group_world_size));
  set("ROLE_WORLD_SIZE", std::to_string(id.role_world_size));
  set("MASTER_ADDR", job.master_addr);
  set("MASTER_PORT", std::to_string(job.master_port));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(job.restart_count));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(job.max_restarts));
  set("TORCHELASTIC_RUN_ID", job.run_id);
  set("TORCHELASTIC_USE_AGENT_STORE", "False");
  set("TORCHELASTIC_ERROR_FILE", error_file);
  env.try_emplace("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  if (id.local_world_size > 1) env.try_emplace("OMP_NUM_THREADS", "1");

  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::string substitute(std::string_view text,
                       const std::map<std::string, std::string>& vars) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == '$' && i + 1 < text.size() && text[i + 1] == '{') {
      size_t close = text.find('}', i + 2);
      if (close != std::string_view::npos) {
        auto it = vars.find(std::string(text.substr(i + 2, close - i - 2)));
        if (it != vars.end()) {
          out += it->second;
          i = close + 1;
          continue;
        }
      }
    }
    out += text[i++];
  }
  return out;
}

std::string line_prefix(const std::string& tmpl, const std::string& role,
                        int local_rank, int rank) {
  return substitute(tmpl.empty() ? "[${role_name}${local_rank}]:" : tmpl,
                    {{"role_name", role},
                     {"local_rank", std::to_string(local_rank)},
                     {"rank", std::to_string(rank)}});
}

}  // namespace dlaunch::agent

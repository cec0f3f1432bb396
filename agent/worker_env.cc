#include "agent/worker_env.h"

#include <unistd.h>

#include <stdexcept>

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

bool agent_test_hook(std::string_view name) {
  return name == kEtcdTestDieBeforeEnd;
}

std::vector<std::string> worker_environment(const EnvMap& base,
                                            const WorkerIdentity& id,
                                            const JobInfo& job,
                                            const std::string& error_file) {
  EnvMap env = base;
  std::erase_if(env, [](const auto& kv) { return agent_test_hook(kv.first); });
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
  if (job.gpu_per_rank) {
    set("CUDA_VISIBLE_DEVICES", gpu_of_worker(base, id.local_rank));
    set("DLAUNCH_CUDA_DEVICE", "0");  // the only device the worker sees
  }

  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::vector<std::string> visible_device_list(const EnvMap& base) {
  std::vector<std::string> out;
  auto it = base.find("CUDA_VISIBLE_DEVICES");
  if (it == base.end() || it->second.empty()) return out;
  std::string_view rest = it->second;
  for (;;) {
    size_t comma = rest.find(',');
    out.emplace_back(rest.substr(0, comma));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return out;
}

std::string gpu_of_worker(const EnvMap& base, int local_rank) {
  std::vector<std::string> list = visible_device_list(base);
  if (list.empty()) return std::to_string(local_rank);
  if (local_rank < 0 || static_cast<size_t>(local_rank) >= list.size()) {
    throw std::invalid_argument("--gpu-binding per-rank: local rank " +
                                std::to_string(local_rank) +
                                " has no GPU in CUDA_VISIBLE_DEVICES=" +
                                base.at("CUDA_VISIBLE_DEVICES") + " (" +
                                std::to_string(list.size()) + " listed)");
  }
  return list[local_rank];
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
                        int local_rank, int rank, const std::string& hostname) {
  return substitute(tmpl.empty() ? "[${role_name}${local_rank}]:" : tmpl,
                    {{"role_name", role},
                     {"local_rank", std::to_string(local_rank)},
                     {"rank", std::to_string(rank)},
                     {"hostname", hostname}});
}

}  // namespace dlaunch::agent

#pragma once

#include <memory>

#include "launcher/agent_launcher.h"

// The backends' factories, one per file in launcher/backends/. A new
// backend is a new file defining its factory, declared here and listed in
// backends.cc.
namespace dlaunch::launcher::backends {

std::unique_ptr<AgentLauncher> make_local();
std::unique_ptr<AgentLauncher> make_ssh();
std::unique_ptr<AgentLauncher> make_pdsh();
std::unique_ptr<AgentLauncher> make_slurm();

// ship_commands() for hosts that are this machine (--launcher local,
// pdsh's exec module): one local `sh -c ship_script()` per copy.
std::vector<AgentCommand> local_ship_commands(const LaunchPlan& plan);

}  // namespace dlaunch::launcher::backends

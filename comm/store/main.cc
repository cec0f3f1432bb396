// dl-store: a standalone store server. Prints "dl-store listening on H:P"
// once bound (P is the real port when --port 0), then serves until SIGINT or
// SIGTERM. With --token-file (or DLAUNCH_RDZV_TOKEN) every client must
// present that token; the token never travels on the command line.

#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "comm/cli_checks.h"
#include "comm/store/resolve.h"
#include "comm/store/server.h"
#include "comm/store/store.h"
#include "comm/store/token.h"

int main(int argc, char** argv) {
  using dlaunch::comm::store::StoreServer;
  using dlaunch::comm::store::StoreServerOptions;

  StoreServerOptions options;
  // Loopback unless told otherwise: serving the network is a choice.
  options.host = "127.0.0.1";
  options.port = 29400;
  CLI::App app{"Serves a dlaunch TCP key-value store until SIGINT or SIGTERM.",
               "dl-store"};
  app.add_option("--host", options.host,
                 "address to bind; --host 0.0.0.0 serves every IPv4 "
                 "interface (the network), the default only this machine")
      ->capture_default_str();
  app.add_option("--port", options.port, "port to bind; 0 picks a free one")
      ->capture_default_str()
      ->check(dlaunch::comm::whole_number<uint16_t>(0));
  std::string token_file;
  app.add_option("--token-file", token_file,
                 "file (mode 0600) holding the job's token, which every "
                 "client must then present; default: $DLAUNCH_RDZV_TOKEN, "
                 "else none");
  app.add_option("--max-frame-bytes", options.max_frame_bytes,
                 "largest request a client may send")
      ->capture_default_str()
      ->check(dlaunch::comm::whole_number<size_t>(1));
  if (auto status = dlaunch::comm::parse_or_exit(app, argc, argv)) {
    return *status;
  }

  namespace store = dlaunch::comm::store;
  try {
    if (!token_file.empty()) {
      options.token = store::read_token_file(token_file);
    } else if (auto t = store::token_from_env(std::getenv(store::kTokenEnv))) {
      options.token = *t;
    }
  } catch (const store::TokenError& e) {
    std::cerr << "dl-store: " << e.what() << "\n";
    return 2;
  }

  // Log lines (bad input, accept failures) go to stderr; stdout carries only
  // the "listening" line that scripts read.
  spdlog::set_default_logger(spdlog::stderr_color_mt("dl-store"));

  // Block the stop signals before the server thread starts, so only the
  // sigwait below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::unique_ptr<StoreServer> server;
  try {
    server = StoreServer::start(options);
  } catch (const dlaunch::comm::store::StoreError& e) {
    std::cerr << "dl-store: " << e.what() << "\n";
    return 1;
  }
  if (options.token.empty() && !store::is_loopback(options.host)) {
    std::cerr << "dl-store: warning: serving " << options.host << ":"
              << server->port()
              << " without a token: anyone who reaches it can read and "
                 "write every key; pass --token-file FILE (mode 0600) with "
                 "the job's token\n";
  }
  std::cout << "dl-store listening on " << options.host << ":" << server->port()
            << std::endl;

  int sig = 0;
  sigwait(&stop_signals, &sig);
  server->stop();
  return 0;
}

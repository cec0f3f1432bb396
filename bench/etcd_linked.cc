// The measurement behind keeping etcd's client out of `dlaunch`
// (docs/performance.md, "Why etcd runs in a helper"): `dlaunch` itself,
// with the etcd backend's client (gRPC, protobuf, abseil, OpenSSL) linked
// in as it would be without the helper. Not installed.
#include "agent/rendezvous/etcd/etcd_rendezvous.h"
#include "launcher/launcher.h"

namespace {
// Taking the constructor's address links the client and everything it
// pulls in, with their static initialisers, as calling it would.
[[gnu::used]] dlaunch::agent::rendezvous::Rendezvous* (*keep)(
    dlaunch::agent::rendezvous::etcd::EtcdRendezvous::Params) =
    [](dlaunch::agent::rendezvous::etcd::EtcdRendezvous::Params p)
    -> dlaunch::agent::rendezvous::Rendezvous* {
  return new dlaunch::agent::rendezvous::etcd::EtcdRendezvous(std::move(p));
};
}  // namespace

int main(int argc, char** argv) { return dlaunch::launcher::main(argc, argv); }

// dlaunch-docs man|bash-completion FILE: writes dlaunch(1) or the bash
// completion (launcher/docs.h); the build runs it, nobody installs it.
#include <cstdio>
#include <fstream>
#include <string_view>

#include "launcher/cli.h"
#include "launcher/docs.h"

int main(int argc, char** argv) {
  using namespace dlaunch::launcher;
  const std::string_view what = argc == 3 ? argv[1] : "";
  if (what != "man" && what != "bash-completion") {
    std::fprintf(stderr, "usage: dlaunch-docs man|bash-completion FILE\n");
    return 2;
  }
  std::ofstream out(argv[2], std::ios::trunc);
  out << (what == "man" ? man_page(help_text(), DLAUNCH_VERSION)
                        : bash_completion());
  out.close();
  if (!out) {
    std::fprintf(stderr, "dlaunch-docs: cannot write %s\n", argv[2]);
    return 1;
  }
  return 0;
}

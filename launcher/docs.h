#pragma once

#include <string>
#include <string_view>

namespace dlaunch::launcher {

// dlaunch(1) in man(7) roff, made from the text of `dlaunch --help` (which
// the flag table generates): its sections become .SH, each flag or variable
// entry a .TP, prose paragraphs filled text, and aligned blocks (exit
// codes, examples) stay as written. `version` goes in the .TH line.
std::string man_page(std::string_view help, std::string_view version);

// A bash completion script for `dlaunch` from the flag table (flags()):
// every spelling of every flag, the fixed values of flags that have them
// (--nproc-per-node cpu|gpu|auto), folders or files for path values. From
// PROG on, the words are the program's and complete as files.
std::string bash_completion();

}  // namespace dlaunch::launcher

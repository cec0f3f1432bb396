// The `dlaunch` command; everything lives in dlaunch::launcher.
#include "launcher/launcher.h"

int main(int argc, char** argv) { return dlaunch::launcher::main(argc, argv); }

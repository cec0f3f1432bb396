#pragma once

#include <cstdio>
#include <cstdlib>

// DLAUNCH_CHECK(cond, msg): a broken invariant (a bug, never bad input)
// prints file, line, condition and message to stderr and aborts. Bad input
// and distributed failures throw instead (docs/errors.md).
#define DLAUNCH_CHECK(cond, msg)                                        \
  do {                                                                  \
    if (!(cond)) [[unlikely]] {                                         \
      std::fprintf(stderr, "dlaunch: check failed at %s:%d: %s (%s)\n", \
                   __FILE__, __LINE__, #cond, msg);                     \
      std::abort();                                                     \
    }                                                                   \
  } while (0)

/* A worker for the restart benchmark: exits 1 on the first attempt
 * (TORCHELASTIC_RESTART_COUNT=0) and 0 after a restart, doing nothing else.
 * With LAUNCH_BENCH_FAIL=0 it never fails (the no-restart baseline). */
#include <stdlib.h>
#include <string.h>

int main(void) {
  const char* fail = getenv("LAUNCH_BENCH_FAIL");
  const char* count = getenv("TORCHELASTIC_RESTART_COUNT");
  if (fail != NULL && strcmp(fail, "0") == 0) return 0;
  return count != NULL && strcmp(count, "0") == 0 ? 1 : 0;
}

/* A worker that leaves behind a stray whose environment reads empty for a
 * while, as a process caught in execve does (a shell's `exec sleep` just as
 * its parent exits): it forks a child that leaves its process group
 * (setsid), makes the page where its environment starts inaccessible
 * (PROT_NONE: /proc/PID/environ then reads nothing), writes its pid to
 * FILE, makes the page readable again after HIDE_MS and sleeps for 300 s. The
 * worker exits 0 once FILE is there, or with `stay` sleeps for 300 s. Where
 * that cannot be done safely the child writes "skip: <why>" to FILE instead and
 * exits.
 *
 * With HIDE_MS "overwrite" the child clears its environment's strings in
 * place instead, for good (as setproctitle does), and sleeps for 300 s.
 *
 * Usage: stray-hiding-env FILE HIDE_MS PAD [stay]. PAD (any text of 8 KiB
 * or more) lies between the stack in use and the environment, which the
 * strings of argv precede: the hidden page holds none of the stack. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* Writes `text` to `file` whole (through a temporary and a rename). */
static void put(const char* file, const char* text) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", file);
  FILE* f = fopen(tmp, "w");
  if (f == NULL) exit(3);
  fputs(text, f);
  if (fclose(f) != 0 || rename(tmp, file) != 0) exit(3);
}

/* Field `want` of /proc/self/stat (50: where the environment starts, 51:
 * where it ends); 0 if unknown. */
static uintptr_t stat_field(int want) {
  char buf[4096];
  FILE* f = fopen("/proc/self/stat", "r");
  if (f == NULL) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char* p = strrchr(buf, ')'); /* the command name may hold spaces */
  if (p == NULL) return 0;
  int field = 2;
  for (char* tok = strtok(p + 1, " "); tok != NULL; tok = strtok(NULL, " ")) {
    if (++field == want) return (uintptr_t)strtoull(tok, NULL, 10);
  }
  return 0;
}

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

int main(int argc, char** argv) {
  if (argc < 4 || argc > 5 || strlen(argv[3]) < 8192 ||
      (argc == 5 && strcmp(argv[4], "stay") != 0)) {
    fprintf(stderr,
            "usage: stray-hiding-env FILE HIDE_MS PAD (8 KiB+) [stay]\n");
    return 2;
  }
  const char* file = argv[1];
  const int overwrite = strcmp(argv[2], "overwrite") == 0;
  const long hide_ms = atol(argv[2]);
  const pid_t pid = fork();
  if (pid < 0) return 3;
  if (pid > 0) {
    while (access(file, F_OK) != 0) sleep_ms(1);
    if (argc == 5) sleep(300);
    return 0;
  }
  setsid();
  if (overwrite) {
    /* As setproctitle does: the environment's strings are cleared where
     * the kernel shows them (the process keeps no pointer into them). */
    const uintptr_t from = stat_field(50);
    const uintptr_t to = stat_field(51);
    char text[64];
    if (from == 0 || to <= from) {
      put(file, "skip: cannot find the environment in /proc/self/stat");
      return 0;
    }
    clearenv();
    memset((void*)from, 0, to - from);
    snprintf(text, sizeof text, "%d", (int)getpid());
    put(file, text);
    sleep(300);
    return 0;
  }
  const long page_size = sysconf(_SC_PAGESIZE);
  const uintptr_t start = stat_field(50);
  const uintptr_t page = start & ~(uintptr_t)(page_size - 1);
  const uintptr_t here = (uintptr_t)&page;
  char text[256];
  if (start == 0 || page_size <= 0 || page_size > 65536 ||
      here + (uintptr_t)page_size > page || (uintptr_t)argv[3] > page) {
    snprintf(text, sizeof text,
             "skip: the environment's first page is not clear of the stack "
             "(environment at %#lx, stack at %#lx)",
             (unsigned long)start, (unsigned long)here);
    put(file, text);
    return 0;
  }
  if (mprotect((void*)page, (size_t)page_size, PROT_NONE) != 0) {
    snprintf(text, sizeof text, "skip: mprotect refused (%s)", strerror(errno));
    put(file, text);
    return 0;
  }
  /* What the agent will see: nothing. */
  char c;
  FILE* env = fopen("/proc/self/environ", "r");
  const size_t got = env != NULL ? fread(&c, 1, 1, env) : 1;
  if (env != NULL) fclose(env);
  if (got != 0) {
    mprotect((void*)page, (size_t)page_size, PROT_READ | PROT_WRITE);
    put(file, "skip: this kernel still reads a PROT_NONE environment");
    return 0;
  }
  snprintf(text, sizeof text, "%d", (int)getpid());
  put(file, text);
  sleep_ms(hide_ms);
  if (mprotect((void*)page, (size_t)page_size, PROT_READ | PROT_WRITE) != 0) {
    return 3;
  }
  sleep(300);
  return 0;
}

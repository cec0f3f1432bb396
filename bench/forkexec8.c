/* The floor for launching 8 workers: fork+exec 8 copies of a program (default
 * `true`), then wait for all 8. bench/launch_bench.sh sets dlaunch, torchrun
 * and mpirun against it. Usage: forkexec8 [N] [PROG] */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 8;
  const char* prog = argc > 2 ? argv[2] : "true";
  for (int i = 0; i < n; ++i) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 1;
    }
    if (pid == 0) {
      execlp(prog, prog, (char*)NULL);
      _exit(127);
    }
  }
  int failed = 0;
  for (int i = 0; i < n; ++i) {
    int status = 0;
    if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      failed = 1;
    }
  }
  return failed;
}

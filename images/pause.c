/* The pod sandbox ("pause") process: containerd starts it first in every pod
 * so that the pod's namespaces have an owner. It does nothing but wait for
 * SIGINT or SIGTERM (then exits 0) and, as PID 1 of a pod that shares its
 * process namespace, reaps the orphans handed to it.
 * Built static (images/pause.Containerfile), so the image needs no libc. */
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
  (void)sig;
  _exit(0);
}

static void reap(int sig) {
  int saved = errno;
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  errno = saved;
}

int main(void) {
  struct sigaction sa = {0};
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = stop;
  if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0) return 1;
  sa.sa_handler = reap;
  sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  if (sigaction(SIGCHLD, &sa, NULL) != 0) return 1;
  for (;;) pause();
}

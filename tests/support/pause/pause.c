/*
 * The sandbox ("pause") process of the test pods: holds the pod's namespaces open,
 * reaps whatever gets re-parented to it, and exits cleanly on SIGTERM or SIGINT.
 * Built with `gcc -static -Os` so the image needs no libc.
 *
 * The three signals stay blocked except inside sigsuspend(), so a signal that
 * arrives between the flag test and the wait cannot be lost.
 */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop_signal;
static volatile sig_atomic_t child_exited;

static void on_signal(int sig) {
    if (sig == SIGCHLD) {
        child_exited = 1;
    } else {
        stop_signal = sig;
    }
}

static void fail(const char *msg) {
    (void)!write(2, msg, strlen(msg));
    _exit(1);
}

int main(void) {
    sigset_t blocked, waiting;
    struct sigaction sa;

    sigemptyset(&blocked);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGINT);
    sigaddset(&blocked, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &blocked, &waiting) < 0) {
        fail("pause: sigprocmask failed\n");
    }
    sigdelset(&waiting, SIGTERM);
    sigdelset(&waiting, SIGINT);
    sigdelset(&waiting, SIGCHLD);

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_NOCLDSTOP;
    if (sigaction(SIGTERM, &sa, NULL) < 0 || sigaction(SIGINT, &sa, NULL) < 0 ||
        sigaction(SIGCHLD, &sa, NULL) < 0) {
        fail("pause: sigaction failed\n");
    }

    while (!stop_signal) {
        sigsuspend(&waiting);
        if (child_exited) {
            child_exited = 0;
            while (waitpid(-1, NULL, WNOHANG) > 0) {
            }
        }
    }
    return 0;
}

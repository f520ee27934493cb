/*
 * nri-cni-shim, compiled: the same program as program.py, for nodes where the ~9 ms start of a
 * Python interpreter per CNI call matters (it is most of the shim's share of a pod's start).
 *
 * Forwards the CNI call to the nri-cni daemon over its local socket and prints the answer:
 *   request  = u32 BE header length | NUL-separated "CNI_*=value" entries | u32 BE stdin length | stdin
 *   response = u8 exit status | u32 BE length | bytes to print on stdout
 * VERSION is answered here. A daemon that cannot be reached is reported as a CNI error object
 * with code 11 ("try again later"). The daemon socket: $NRI_CNI_SOCKET, else the config's
 * "daemonSocket" string, else the default compiled in (-DDEFAULT_SOCKET="...").
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef DEFAULT_SOCKET
#define DEFAULT_SOCKET "/run/nri-cni/nri-cni.sock"
#endif
#define MAX_STDIN (4u << 20)
#define MAX_ANSWER (64u << 20)

extern char **environ;

struct buf { char *data; size_t len, cap; };

static void put(struct buf *b, const void *data, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        b->data = realloc(b->data, cap);
        if (!b->data) { perror("nri-cni-shim"); exit(2); }
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
}

static void put_u32(struct buf *b, uint32_t v) {
    unsigned char be[4] = {v >> 24, v >> 16, v >> 8, v};
    put(b, be, 4);
}

/* A plain string value of "key" in the config, without a JSON parser (no escapes handled:
 * a socket path or a version never needs them). Returns a malloc'd string or NULL. */
static char *string_field(const struct buf *conf, const char *key) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\"", key);
    size_t plen = strlen(pattern);
    for (size_t i = 0; i + plen <= conf->len; i++) {
        if (memcmp(conf->data + i, pattern, plen) != 0) continue;
        size_t j = i + plen;
        while (j < conf->len && strchr(" \t\r\n", conf->data[j])) j++;
        if (j >= conf->len || conf->data[j] != ':') continue;
        j++;
        while (j < conf->len && strchr(" \t\r\n", conf->data[j])) j++;
        if (j >= conf->len || conf->data[j] != '"') continue;
        size_t start = ++j;
        while (j < conf->len && conf->data[j] != '"' && conf->data[j] != '\\') j++;
        if (j >= conf->len || conf->data[j] != '"') return NULL;
        char *out = strndup(conf->data + start, j - start);
        return out;
    }
    return NULL;
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static int fail(const char *version, int code, const char *msg, const char *detail) {
    fputs("{\"cniVersion\":", stdout);
    json_string(stdout, version);
    fprintf(stdout, ",\"code\":%d,\"msg\":", code);
    json_string(stdout, msg);
    fputs(",\"details\":", stdout);
    json_string(stdout, detail);
    fputs("}\n", stdout);
    return 1;
}

static int read_exactly(int fd, void *dst, size_t n) {
    char *p = dst;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) { if (r == 0) errno = ECONNRESET; return -1; }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int main(void) {
    struct buf conf = {0};
    char chunk[65536];
    ssize_t r;
    while ((r = read(0, chunk, sizeof chunk)) != 0) {
        if (r < 0) { if (errno == EINTR) continue; break; }
        put(&conf, chunk, (size_t)r);
        if (conf.len > MAX_STDIN) return fail("1.0.0", 4, "the network config is over 4 MiB", "");
    }
    char *version = string_field(&conf, "cniVersion");
    if (!version) version = "1.0.0";
    const char *command = getenv("CNI_COMMAND");
    if (command && strcmp(command, "VERSION") == 0) {
        fputs("{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"0.1.0\",\"0.2.0\",\"0.3.0\","
              "\"0.3.1\",\"0.4.0\",\"1.0.0\",\"1.1.0\"]}\n", stdout);
        return 0;
    }
    if (!command || !*command) return fail(version, 4, "CNI_COMMAND is not set", "");

    const char *path = getenv("NRI_CNI_SOCKET");
    if (!path || !*path) path = string_field(&conf, "daemonSocket");
    if (!path) path = DEFAULT_SOCKET;

    struct buf head = {0}, req = {0};
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, "CNI_", 4) != 0) continue;
        if (head.len) put(&head, "", 1);
        put(&head, *e, strlen(*e));
    }
    put_u32(&req, (uint32_t)head.len);
    if (head.len) put(&req, head.data, head.len);
    put_u32(&req, (uint32_t)conf.len);
    if (conf.len) put(&req, conf.data, conf.len);

    char msg[512];
    snprintf(msg, sizeof msg, "nri-cni daemon is not reachable at %s", path);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) return fail(version, 11, msg, "socket path too long");
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return fail(version, 11, msg, strerror(errno));
    struct timeval tv = {.tv_sec = 600};  /* the daemon bounds every plugin; this bounds us */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0)
        return fail(version, 11, msg, strerror(errno));
    if (write_all(fd, req.data, req.len) < 0) return fail(version, 11, msg, strerror(errno));
    unsigned char answer[5];
    if (read_exactly(fd, answer, 5) < 0) return fail(version, 11, msg, strerror(errno));
    uint32_t n = (uint32_t)answer[1] << 24 | answer[2] << 16 | answer[3] << 8 | answer[4];
    if (n > MAX_ANSWER) return fail(version, 11, msg, "answer too large");
    char *payload = malloc(n ? n : 1);
    if (!payload || read_exactly(fd, payload, n) < 0) return fail(version, 11, msg, strerror(errno));
    if (write_all(1, payload, n) < 0) return 1;
    return answer[0];
}

/*
 * nri-cni-shim, compiled: the same program as program.py, for nodes where the ~9 ms start of a
 * Python interpreter per CNI call matters (it is most of the shim's share of a pod's start).
 *
 * Forwards the CNI call to the nri-cni daemon over its local socket and prints the answer:
 *   request  = u32 BE header length | NUL-separated "CNI_*=value" entries | u32 BE stdin length | stdin
 *   response = u8 exit status | u32 BE length | bytes to print on stdout
 * VERSION is answered here. A daemon that cannot be reached is reported as a CNI error object
 * with code 11 ("try again later"). The daemon socket: $NRI_CNI_SOCKET, else the config's
 * top-level "daemonSocket" string, else the default compiled in (-DDEFAULT_SOCKET="...").
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

/* The config's top level, read by a small JSON scanner without recursion: only the keys of the
 * top-level object count (a pod annotation named "daemonSocket", nested in runtimeConfig, must
 * never choose where the shim connects); the last of a repeated key wins, as in the daemon's
 * parser; a config that is not one JSON object yields nothing (the built-in defaults). */
struct scan { const char *s; size_t n, i; };

static void skip_ws(struct scan *sc) {
    while (sc->i < sc->n && strchr(" \t\r\n", sc->s[sc->i]) && sc->s[sc->i]) sc->i++;
}

static int hex4(struct scan *sc, unsigned *out) {
    if (sc->i + 4 > sc->n) return -1;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = sc->s[sc->i + k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    sc->i += 4;
    *out = v;
    return 0;
}

static void put_utf8(struct buf *b, unsigned cp) {
    unsigned char u[4];
    size_t n;
    if (cp < 0x80) { u[0] = (unsigned char)cp; n = 1; }
    else if (cp < 0x800) { u[0] = 0xC0 | cp >> 6; u[1] = 0x80 | (cp & 0x3F); n = 2; }
    else if (cp < 0x10000) { u[0] = 0xE0 | cp >> 12; u[1] = 0x80 | (cp >> 6 & 0x3F); u[2] = 0x80 | (cp & 0x3F); n = 3; }
    else { u[0] = 0xF0 | cp >> 18; u[1] = 0x80 | (cp >> 12 & 0x3F); u[2] = 0x80 | (cp >> 6 & 0x3F); u[3] = 0x80 | (cp & 0x3F); n = 4; }
    put(b, u, n);
}

/* sc->s[sc->i] is the opening quote. Decodes into *out when out is not NULL. */
static int read_string(struct scan *sc, struct buf *out) {
    sc->i++;
    while (sc->i < sc->n) {
        char c = sc->s[sc->i++];
        if (c == '"') return 0;
        if (c != '\\') { if (out) put(out, &c, 1); continue; }
        if (sc->i >= sc->n) return -1;
        char e = sc->s[sc->i++];
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        const char *hit = e ? strchr(from, e) : NULL;
        if (hit) { if (out) put(out, &to[hit - from], 1); continue; }
        if (e != 'u') return -1;
        unsigned cp, low;
        if (hex4(sc, &cp) < 0) return -1;
        if (cp >= 0xD800 && cp < 0xDC00 && sc->i + 6 <= sc->n && sc->s[sc->i] == '\\' && sc->s[sc->i + 1] == 'u') {
            size_t at = sc->i;
            sc->i += 2;
            if (hex4(sc, &low) == 0 && low >= 0xDC00 && low < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            else sc->i = at;
        }
        if (out) put_utf8(out, cp);
    }
    return -1;
}

static int skip_value(struct scan *sc) {
    size_t depth = 0, start = sc->i;
    while (sc->i < sc->n) {
        char c = sc->s[sc->i];
        if (c == '"') {
            if (read_string(sc, NULL) < 0) return -1;
            if (depth == 0) return 0;
            continue;
        }
        if (c == '[' || c == '{') depth++;
        else if (c == ']' || c == '}') {
            if (depth == 0) break;
            if (--depth == 0) { sc->i++; return 0; }
        } else if (depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\r' || c == '\n')) break;
        sc->i++;
    }
    return depth || sc->i == start ? -1 : 0;
}

/* The string value of top-level `key` as a malloc'd C string; NULL when absent, not a string,
 * holding a NUL, or when the config is not one JSON object. */
static char *top_level_string(const struct buf *conf, const char *key) {
    struct scan sc = {conf->data ? conf->data : "", conf->len, 0};
    struct buf k = {0}, v = {0};
    char *found = NULL;
    skip_ws(&sc);
    if (sc.i >= sc.n || sc.s[sc.i] != '{') goto bad;
    sc.i++;
    skip_ws(&sc);
    if (sc.i < sc.n && sc.s[sc.i] == '}') { sc.i++; goto end; }
    for (;;) {
        if (sc.i >= sc.n || sc.s[sc.i] != '"') goto bad;
        k.len = 0;
        if (read_string(&sc, &k) < 0) goto bad;
        int match = k.len == strlen(key) && memcmp(k.data, key, k.len) == 0;
        skip_ws(&sc);
        if (sc.i >= sc.n || sc.s[sc.i] != ':') goto bad;
        sc.i++;
        skip_ws(&sc);
        if (sc.i < sc.n && sc.s[sc.i] == '"') {
            v.len = 0;
            if (read_string(&sc, &v) < 0) goto bad;
            if (match) {
                free(found);
                found = memchr(v.data ? v.data : "", 0, v.len) ? NULL : strndup(v.data ? v.data : "", v.len);
            }
        } else {
            if (skip_value(&sc) < 0) goto bad;
            if (match) { free(found); found = NULL; }
        }
        skip_ws(&sc);
        if (sc.i < sc.n && sc.s[sc.i] == ',') { sc.i++; skip_ws(&sc); continue; }
        if (sc.i < sc.n && sc.s[sc.i] == '}') { sc.i++; break; }
        goto bad;
    }
end:
    skip_ws(&sc);
    if (sc.i != sc.n) goto bad;
    free(k.data);
    free(v.data);
    return found;
bad:
    free(k.data);
    free(v.data);
    free(found);
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
    char *version = top_level_string(&conf, "cniVersion");
    /* echoed in our errors: only what looks like a version */
    if (!version || !*version || strlen(version) > 16 || version[strspn(version, "0123456789.")])
        version = "1.0.0";
    const char *command = getenv("CNI_COMMAND");
    if (command && strcmp(command, "VERSION") == 0) {
        fputs("{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"0.1.0\",\"0.2.0\",\"0.3.0\","
              "\"0.3.1\",\"0.4.0\",\"1.0.0\",\"1.1.0\"]}\n", stdout);
        return 0;
    }
    if (!command || !*command) return fail(version, 4, "CNI_COMMAND is not set", "");

    const char *path = getenv("NRI_CNI_SOCKET");
    if (!path || !*path) path = top_level_string(&conf, "daemonSocket");
    if (!path || !*path) path = DEFAULT_SOCKET;

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

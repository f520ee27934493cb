# nri-cni-shim: forwards a CNI call to the nri-cni daemon and prints its answer.
#
# Standalone on purpose: only builtins and the C module _socket, no json (it alone costs ~17 ms
# of imports), no package; the few keys it reads (cniVersion, daemonSocket) come from the top level
# of the config by a small non-recursive JSON scanner. The environment's CNI_* variables and the raw stdin go to the daemon
# over its local socket (see nri_cni/local/proto.py for the framing); the daemon runs the pod's
# whole network plan and answers with the bytes to print and the exit status. VERSION is answered
# here so that it works while the daemon is down. Any failure to reach the daemon is printed as a
# CNI error object with code 11 ("try again later").
import _socket
import os
import sys

# `nri-cni install-shim` replaces this import with the text of nri_cni/local/codec.py: the
# installed script imports nothing of the package.
from nri_cni.local.codec import (  # @LOCAL_CODEC@
    RESPONSE_HEAD,
    decode_response_head,
    encode_request,
)

DEFAULT_SOCKET = "@DEFAULT_SOCKET@"
SUPPORTED = '["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]'
TIMEOUT = 600.0
MAX_STDIN = 4 << 20  # as the C build and the daemon


def json_string(text):
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20:
            out.append("\\u%04x" % ord(ch))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


WS = " \t\r\n"
ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
HEX = "0123456789abcdefABCDEF"


def skip_ws(text, i):
    n = len(text)
    while i < n and text[i] in WS:
        i += 1
    return i


def read_hex4(text, i):
    digits = text[i : i + 4]
    if len(digits) != 4 or any(c not in HEX for c in digits):
        raise ValueError("bad \\u escape")
    return int(digits, 16)


def read_string(text, i):
    # text[i] is the opening quote; returns (the decoded string, the index after it)
    out = []
    i += 1
    while True:
        end = text.find('"', i)
        if end < 0:
            raise ValueError("unterminated string")
        esc = text.find("\\", i, end)
        if esc < 0:
            out.append(text[i:end])
            return "".join(out), end + 1
        out.append(text[i:esc])
        kind = text[esc + 1 : esc + 2]
        if kind == "u":
            code = read_hex4(text, esc + 2)
            i = esc + 6
            if 0xD800 <= code < 0xDC00 and text[i : i + 2] == "\\u":
                low = read_hex4(text, i + 2)
                if 0xDC00 <= low < 0xE000:
                    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                    i += 6
            out.append(chr(code))
        elif kind in ESCAPES:
            out.append(ESCAPES[kind])
            i = esc + 2
        else:
            raise ValueError("bad escape")


def skip_string(text, i):
    j = i + 1
    while True:
        j = text.find('"', j)
        if j < 0:
            raise ValueError("unterminated string")
        b = j - 1
        while text[b] == "\\":
            b -= 1
        if (j - 1 - b) % 2 == 0:
            return j + 1
        j += 1


def skip_value(text, i):
    # a number, literal, string, array or object; without recursion (any depth)
    depth = 0
    n = len(text)
    start = i
    while i < n:
        c = text[i]
        if c == '"':
            i = skip_string(text, i)
            if depth == 0:
                return i
            continue
        if c in "[{":
            depth += 1
        elif c in "]}":
            if depth == 0:
                break
            depth -= 1
            if depth == 0:
                return i + 1
        elif depth == 0 and (c == "," or c in WS):
            break
        i += 1
    if depth or i == start:
        raise ValueError("truncated value")
    return i


def top_level_strings(text):
    # The string values of the top-level object's keys (the last of a repeated key wins, as in
    # the daemon's parser); {} when the text is not one JSON object. Nested keys never count:
    # a pod annotation named "daemonSocket" must not choose where the shim connects.
    out: dict = {}
    n = len(text)
    try:
        i = skip_ws(text, 0)
        if i >= n or text[i] != "{":
            return {}
        i = skip_ws(text, i + 1)
        if i < n and text[i] == "}":
            return out if skip_ws(text, i + 1) == n else {}
        while True:
            if i >= n or text[i] != '"':
                return {}
            key, i = read_string(text, i)
            i = skip_ws(text, i)
            if i >= n or text[i] != ":":
                return {}
            i = skip_ws(text, i + 1)
            if i < n and text[i] == '"':
                out[key], i = read_string(text, i)
            else:
                i = skip_value(text, i)
                out.pop(key, None)
            i = skip_ws(text, i)
            if i < n and text[i] == ",":
                i = skip_ws(text, i + 1)
                continue
            if i < n and text[i] == "}" and skip_ws(text, i + 1) == n:
                return out
            return {}
    except ValueError:
        return {}


def fail(version, code, msg, details=""):
    sys.stdout.write(
        '{"cniVersion":%s,"code":%d,"msg":%s,"details":%s}\n'
        % (json_string(version), code, json_string(msg), json_string(details))
    )
    return 1


def recv_exactly(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise OSError("the daemon closed the connection before answering")
        buf += chunk
    return buf


def main():
    conf = sys.stdin.buffer.read(MAX_STDIN + 1)
    if len(conf) > MAX_STDIN:
        return fail("1.0.0", 4, "the network config is over 4 MiB")
    fields = top_level_strings(conf.decode("utf-8", "surrogateescape"))
    version = fields.get("cniVersion")
    if not version or len(version) > 16 or version.strip("0123456789."):
        version = "1.0.0"  # echoed in our errors: only what looks like a version
    command = os.environ.get("CNI_COMMAND", "")
    if command == "VERSION":
        sys.stdout.write('{"cniVersion":"1.1.0","supportedVersions":%s}\n' % SUPPORTED)
        return 0
    if not command:
        return fail(version, 4, "CNI_COMMAND is not set")
    path = os.environ.get("NRI_CNI_SOCKET") or fields.get("daemonSocket") or DEFAULT_SOCKET
    if "\0" in path:
        path = DEFAULT_SOCKET
    request = encode_request([(k, v) for k, v in os.environ.items() if k.startswith("CNI_")], conf)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.settimeout(TIMEOUT)
    try:
        sock.connect(path)
        sock.sendall(request)
        status, length = decode_response_head(recv_exactly(sock, RESPONSE_HEAD))
        payload = recv_exactly(sock, length)
    except OSError as exc:
        return fail(version, 11, "nri-cni daemon is not reachable at " + path, str(exc.strerror or exc))
    finally:
        sock.close()
    sys.stdout.buffer.write(payload)
    return status


sys.exit(main())

# nri-cni-shim: forwards a CNI call to the nri-cni daemon and prints its answer.
#
# Standalone on purpose: only builtins and the C module _socket, no json (it alone costs ~17 ms
# of imports), no package. The environment's CNI_* variables and the raw stdin go to the daemon
# over its local socket (see nri_cni/localproto.py for the framing); the daemon runs the pod's
# whole network plan and answers with the bytes to print and the exit status. VERSION is answered
# here so that it works while the daemon is down. Any failure to reach the daemon is printed as a
# CNI error object with code 11 ("try again later").
import _socket
import os
import sys

# `nri-cni install-shim` replaces this import with the text of nri_cni/localcodec.py: the
# installed script imports nothing of the package.
from nri_cni.localcodec import (  # @LOCAL_CODEC@
    RESPONSE_HEAD,
    decode_response_head,
    encode_request,
)

DEFAULT_SOCKET = "@DEFAULT_SOCKET@"
SUPPORTED = '["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]'
TIMEOUT = 600.0


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


def string_field(conf, key):
    # A plain string value of a top-level-looking key, without a JSON parser. Values with
    # escapes are not understood (and not needed: a socket path or a version).
    at = conf.find(b'"' + key + b'"')
    if at < 0:
        return None
    rest = conf[at + len(key) + 2 :].lstrip()
    if not rest.startswith(b":"):
        return None
    rest = rest[1:].lstrip()
    if not rest.startswith(b'"'):
        return None
    end = rest.find(b'"', 1)
    value = rest[1:end]
    if end < 0 or b"\\" in value:
        return None
    return value.decode()


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
    conf = sys.stdin.buffer.read()
    version = string_field(conf, b"cniVersion") or "1.0.0"
    command = os.environ.get("CNI_COMMAND", "")
    if command == "VERSION":
        sys.stdout.write('{"cniVersion":"1.1.0","supportedVersions":%s}\n' % SUPPORTED)
        return 0
    if not command:
        return fail(version, 4, "CNI_COMMAND is not set")
    path = os.environ.get("NRI_CNI_SOCKET") or string_field(conf, b"daemonSocket") or DEFAULT_SOCKET
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

"""Bad input to crun's Horovod rendezvous (tests/integration/test_contracts.py), from a worker
of a --contract horovod job: sends HOROVOD_GLOO_RENDEZVOUS_ADDR:PORT malformed and oversized
requests over real HTTP and writes each answer's status and first line to OUT_DIR, then checks
that the store still answers. Standard library only.

  crun --contract horovod ... horovod_kv_probe.py OUT_DIR
"""
import http.client
import json
import os
import socket
import sys


def ask(method, path, body=None, headers=None):
    c = http.client.HTTPConnection(os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                                   int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]), timeout=30)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read().decode(errors="replace").strip()
    except (ConnectionError, http.client.HTTPException) as e:
        return None, f"{type(e).__name__}: {e}"
    finally:
        c.close()


def announce_large(path, length):
    """Headers announcing a body of `length` bytes, none sent: the answer comes first (a server
    that refuses it closes the connection, and a client still sending would get EPIPE)."""
    with socket.create_connection((os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                                   int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])), 30) as s:
        s.sendall(f"PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
                  .encode())
        got = b""
        while b"\r\n\r\n" not in got or not got.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    head, _, body = got.decode(errors="replace").partition("\r\n\r\n")
    return int(head.split()[1]), body.strip()


def main():
    out = sys.argv[1]
    rank = os.environ["RANK"]
    answers = {
        "malformed path": ask("GET", "/only-a-scope"),
        "too deep": ask("PUT", "/a/b/c", b"x"),
        "wrong method": ask("POST", "/global/k", b"x"),
        "key too long": ask("PUT", "/global/" + "k" * 2000, b"x"),
        "body too large": announce_large(f"/probe/big{rank}", 2 << 20),
        "put": ask("PUT", f"/probe/{rank}", b"value"),
        "get": ask("GET", f"/probe/{rank}"),
        "absent": ask("GET", "/probe/absent"),
    }
    with open(os.path.join(out, f"kv_{rank}.json"), "w") as f:
        json.dump(answers, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""TCP peers the tests and benchmarks run in their network namespaces, as
`python -c SCRIPT ADDRESS PORT [SIZE]`. Each prints "ready" once it listens.

DRAIN     reads and drops what each connection sends (a storage server, a
          bulk flow's sink).
ACK_SINK  answers every SIZE bytes a connection sends with one byte (a rank's
          peer: the sender's step waits for its data to arrive).
"""

# Both: listen on ADDRESS:PORT, then say so.
_LISTEN = """
import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(64)
print("ready", flush=True)
"""

DRAIN = (
    _LISTEN
    + """def drain(c):
    while c.recv(1 << 20):
        pass
while True:
    c, _ = s.accept()
    threading.Thread(target=drain, args=(c,), daemon=True).start()
"""
)

ACK_SINK = (
    _LISTEN
    + """size = int(sys.argv[3])
def serve(c):
    got = 0
    while True:
        b = c.recv(1 << 20)
        if not b:
            return
        got += len(b)
        while got >= size:
            got -= size
            c.sendall(b"k")
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""
)

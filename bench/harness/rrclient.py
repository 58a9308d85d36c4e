#!/usr/bin/env python3
"""One blocking connection, a fixed count of request/response round trips.

The plainest client there is: one thread, one socket, sendall() then recv()
until the response is complete, the thread asleep in recv() while the path
answers. zbench --clients runs it beside zload (issue 36, "two clients, two
verdicts"). Standard library only (socket, ssl, struct, time).

It speaks zload's wire header (bench/load/wire.go: "zld1", op 'R', request
and response sizes), so the lab's zload servers answer it, over plain TCP,
over mutual TLS (--tls: an mTLS terminator such as HAProxy's) or over HBONE
(--hbone AUTHORITY: mutual TLS, HTTP/2 and one CONNECT stream, with just
enough HTTP/2 for that: no HPACK table, no Huffman, one stream).

It prints one JSON object: count, seconds, per_second and the latency
percentiles in microseconds (p50_us, p90_us, p99_us, max_us, mean_us).
"""

import argparse
import json
import socket
import ssl
import struct
import sys
import time

HEADER = struct.Struct(">4sB3xII")  # zload's 16-byte header

# HTTP/2 frame types and flags (RFC 9113).
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def hpack_literal(name, value):
    """A header field as HPACK's literal without indexing, new name, no Huffman."""
    out = bytearray([0])
    for s in (name, value):
        b = s.encode()
        if len(b) >= 127:
            raise ValueError("header too long for this client")
        out.append(len(b))
        out += b
    return bytes(out)


def frame(ftype, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", stream) + payload


class Plain:
    """A byte stream over a socket (plain or TLS)."""

    def __init__(self, sock):
        self.sock = sock

    def send(self, b):
        self.sock.sendall(b)

    def recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError("connection closed after %d of %d bytes" % (len(buf), n))
            buf += chunk
        return bytes(buf)


class HBONE:
    """One CONNECT stream over HTTP/2 on a TLS socket, as a byte stream."""

    STREAM = 1
    WINDOW_STEP = 1 << 15  # return receive window every 32 KiB

    def __init__(self, sock, authority):
        self.sock = sock
        self.rbuf = bytearray()
        self.data = bytearray()
        self.unacked = 0
        self.last = self.framed = None
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0)
                     + frame(HEADERS, END_HEADERS, self.STREAM,
                             hpack_literal(":method", "CONNECT") + hpack_literal(":authority", authority)))
        while True:
            ftype, flags, stream, payload = self._frame()
            if ftype == HEADERS and stream == self.STREAM:
                # ":status: 200" is static index 8 (0x88); anything else is a refusal.
                if not payload.startswith(b"\x88") or flags & END_STREAM:
                    raise ConnectionError("CONNECT refused: header block %r" % payload[:32])
                return

    def _fill(self, n):
        while len(self.rbuf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("HBONE connection closed")
            self.rbuf += chunk

    def _frame(self):
        """Reads one frame, answering the connection's SETTINGS and PINGs."""
        while True:
            self._fill(9)
            length = int.from_bytes(self.rbuf[0:3], "big")
            ftype, flags = self.rbuf[3], self.rbuf[4]
            stream = int.from_bytes(self.rbuf[5:9], "big") & 0x7FFFFFFF
            self._fill(9 + length)
            payload = bytes(self.rbuf[9:9 + length])
            del self.rbuf[:9 + length]
            if ftype == SETTINGS and not flags & ACK:
                self.sock.sendall(frame(SETTINGS, ACK, 0))
            elif ftype == PING and not flags & ACK:
                self.sock.sendall(frame(PING, ACK, 0, payload))
            elif ftype in (RST_STREAM, GOAWAY):
                raise ConnectionError("HBONE peer sent frame type %d: %r" % (ftype, payload[:32]))
            else:
                return ftype, flags, stream, payload

    def send(self, b):
        # The loop sends the same request each time: frame it once, so the
        # interpreter's share of a round trip stays near the plain client's.
        if b is not self.last:
            self.last, self.framed = b, frame(DATA, 0, self.STREAM, b)
        self.sock.sendall(self.framed)

    def recv_exact(self, n):
        while len(self.data) < n:
            ftype, flags, stream, payload = self._frame()
            if ftype != DATA or stream != self.STREAM:
                continue
            if flags & END_STREAM and len(self.data) + len(payload) < n:
                raise EOFError("stream ended")
            self.data += payload
            self.unacked += len(payload)
            if self.unacked >= self.WINDOW_STEP:
                inc = struct.pack(">I", self.unacked)
                self.sock.sendall(frame(WINDOW_UPDATE, 0, 0, inc) + frame(WINDOW_UPDATE, 0, self.STREAM, inc))
                self.unacked = 0
        out = bytes(self.data[:n])
        del self.data[:n]
        return out


def percentile(sorted_us, q):
    if not sorted_us:
        return 0.0
    i = min(len(sorted_us) - 1, max(0, int(round(q * len(sorted_us) + 0.5)) - 1))
    return sorted_us[i]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="host:port")
    ap.add_argument("--count", type=int, default=10000, help="round trips measured")
    ap.add_argument("--warmup", type=int, default=100, help="round trips before measuring")
    ap.add_argument("--req-size", type=int, default=1)
    ap.add_argument("--resp-size", type=int, default=1)
    ap.add_argument("--tls", action="store_true", help="mutual TLS to an mTLS terminator")
    ap.add_argument("--hbone", metavar="AUTHORITY", help="mutual TLS, HTTP/2 CONNECT to AUTHORITY")
    ap.add_argument("--cert", help="PEM: certificate chain, then key (--tls, --hbone)")
    ap.add_argument("--ca", help="PEM: the CA that verifies the server (--tls, --hbone)")
    ap.add_argument("--nodelay", action="store_true", help="set TCP_NODELAY")
    a = ap.parse_args(argv)
    if a.count <= 0 or a.warmup < 0 or a.req_size <= 0 or a.resp_size < 0:
        ap.error("counts and sizes must be positive")
    host, _, port = a.target.rpartition(":")
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=30)
    if a.nodelay:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if a.tls or a.hbone:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.check_hostname = False  # SPIFFE certificates carry a URI SAN only
        ctx.load_verify_locations(a.ca)
        ctx.load_cert_chain(a.cert)
        if a.hbone:
            ctx.set_alpn_protocols(["h2"])
        sock = ctx.wrap_socket(sock)
    conn = HBONE(sock, a.hbone) if a.hbone else Plain(sock)
    req = b"x" * a.req_size
    conn.send(HEADER.pack(b"zld1", ord("R"), a.req_size, a.resp_size))
    for _ in range(a.warmup):
        conn.send(req)
        conn.recv_exact(a.resp_size)
    lat = []
    clock = time.perf_counter_ns
    start = clock()
    for _ in range(a.count):
        t0 = clock()
        conn.send(req)
        conn.recv_exact(a.resp_size)
        lat.append(clock() - t0)
    secs = (clock() - start) / 1e9
    us = sorted(v / 1000 for v in lat)
    json.dump({
        "count": a.count, "seconds": secs, "per_second": a.count / secs,
        "p50_us": percentile(us, 0.50), "p90_us": percentile(us, 0.90), "p99_us": percentile(us, 0.99),
        "max_us": us[-1], "mean_us": sum(us) / len(us),
    }, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])

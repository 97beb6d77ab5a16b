"""TLS for the tests: a certificate authority and a server certificate made with the `openssl`
tool, and a relay that terminates TLS in front of a plain server (as a TLS-terminating proxy
would in front of `homing up`)."""

from __future__ import annotations

import select
import shutil
import socket
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from .listener import Listener


@dataclass
class Certs:
    ca: Path  # the authority a client is told to trust (SSL_CERT_FILE)
    cert: Path  # the server's certificate, for 127.0.0.1 and localhost
    key: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx


def make_certs(tmp: Path) -> Certs:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("the TLS tests need the openssl tool (Debian package openssl)")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=tmp, check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    # Python 3.13 verifies strictly (VERIFY_X509_STRICT): an authority must say it signs
    # certificates.
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=homing test authority",
        "-addext", "basicConstraints = critical, CA:TRUE",
        "-addext", "keyUsage = critical, keyCertSign, cRLSign")
    run("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (tmp / "server.ext").write_text(
        "subjectAltName = IP:127.0.0.1, DNS:localhost\n"
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature\n"
        "extendedKeyUsage = serverAuth\n"
        "authorityKeyIdentifier = keyid\n"
        "subjectKeyIdentifier = hash\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    return Certs(tmp / "ca.pem", tmp / "server.pem", tmp / "server.key")


class TlsRelay(Listener):
    """Accepts TLS connections on a loopback port and relays each, decrypted, to a plain
    server on `target_port`; counts the connections it accepted."""

    def __init__(self, certs: Certs, target_port: int) -> None:
        super().__init__()
        self.ctx = certs.server_context()
        self.target_port = target_port
        self.url = f"https://127.0.0.1:{self.port}"
        self.start()

    def handle(self, conn: socket.socket) -> None:
        self.relay(conn)

    def relay(self, raw: socket.socket) -> None:
        """One thread per connection (an SSL socket is not to be used by two at once). When the
        client has said all, the server is told so (half-close); when the server stops
        reading, what the client still sends is read and dropped, so the server's answer (a
        413 sent before the body was read) still reaches it; when the server closes, so does
        the client's connection."""
        try:
            client = self.ctx.wrap_socket(raw, server_side=True)
        except OSError:
            raw.close()
            return  # a client that refused our certificate
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
        except OSError:
            client.close()
            return  # the server is down: the client sees its connection end
        # As a TLS terminator does: a relayed answer split in two writes must not wait for the
        # peer's delayed acknowledgement (40 ms a call).
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reading_client, forwarding = True, True
        try:
            while True:
                waiting: list[socket.socket] = [upstream]
                if reading_client:
                    waiting.append(client)
                ready: list[socket.socket]
                if reading_client and client.pending():
                    ready = [client]
                else:
                    ready = select.select(waiting, [], [])[0]
                if upstream in ready:
                    data = upstream.recv(65536)
                    if not data:
                        return
                    client.sendall(data)
                if client in ready:
                    data = client.recv(65536)
                    if not data:
                        reading_client = False
                        if forwarding:
                            upstream.shutdown(socket.SHUT_WR)
                    elif forwarding:
                        try:
                            upstream.sendall(data)
                        except OSError:
                            forwarding = False
        except OSError:
            pass
        finally:
            client.close()
            upstream.close()

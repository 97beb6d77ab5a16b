"""A loopback listener for the tests' small servers: accepts on a port of its own and hands
each connection to `handle` on a thread of its own, counting them."""

from __future__ import annotations

import socket
import threading


class Listener:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]
        self.connections = 0

    def start(self) -> None:
        threading.Thread(target=self.serve, daemon=True).start()

    def close(self) -> None:
        self.sock.close()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

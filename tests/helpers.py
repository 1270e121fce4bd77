"""Small helpers shared by test packages (import them; conftest modules are not for importing)."""

from __future__ import annotations

import socket

import psutil


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (the socket is closed before returning)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def alive(pid: int) -> bool:
    """True when ``pid`` is a live (non-zombie) process."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

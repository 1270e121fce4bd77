"""A stand-in for a supervisor that gets ``kill -9``-ed while its tunnel runs.

Usage: python orphan_helper.py <cloudflared binary> <origin port> <run dir>. Prints ``READY <url>``
on stdout once the tunnel is up (recorded in ``<run dir>/tunnel.json`` by the launcher's owner),
then waits to be killed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from launcher.process import TunnelOwner
from tunnel import TunnelOptions, run_cloudflared_tunnel


async def main(binary: str, port: int, run_dir: str) -> None:
    options = TunnelOptions(
        Path(binary), port, owner=TunnelOwner(Path(run_dir)), probe_interval=0.1
    )
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(run_cloudflared_tunnel, options)
        print("READY", handle.public_url, flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]), sys.argv[3])

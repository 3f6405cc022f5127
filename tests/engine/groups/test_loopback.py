"""The torch rendezvous of a group on one machine (the local backend's) is reachable from this
machine only: it listens on the loopback address. A Ray instance hflow starts is checked the same
way, with its workers' rendezvous, in `test_ray_watchdog.py`."""

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT_HEAD = """
import ipaddress, json, os, sys
from pathlib import Path

def socket_inodes(pid):
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes

def listening(pids):
    # Every TCP socket in LISTEN state that one of `pids` holds: its local address.
    inodes = set().union(*(socket_inodes(p) for p in pids))
    found = []
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:
                continue
            raw = bytes.fromhex(fields[1].split(":")[0])
            # /proc/net/tcp* print each 32-bit word in host (little-endian) order
            addr = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.append(str(ipaddress.ip_address(addr)))
    return found

"""


def _run(body: str, env: dict | None = None) -> dict:
    result = subprocess.run([sys.executable, "-c", SCRIPT_HEAD + body], capture_output=True, text=True,
                            timeout=300, env={**os.environ, **(env or {})}, cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback  # ::ffff:127.0.0.1 too


def _all_loopback(addresses: list[str]) -> bool:
    return all(_loopback(a) for a in addresses)


def test_a_rendezvous_on_this_machine_listens_on_the_loopback_address_only():
    # torch's TCPStore alone would listen on every interface (0.0.0.0) whatever MASTER_ADDR says.
    seen = _run("""
import torch
from hflow.engine.groups.dist import ensure_process_group
ensure_process_group(torch.device("cpu"), 0, 1)
print(json.dumps({"addresses": listening([os.getpid()])}))
""")
    assert seen["addresses"], "the rendezvous listens somewhere"
    assert _all_loopback(seen["addresses"]), seen

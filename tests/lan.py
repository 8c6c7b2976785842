"""A LAN a test builds for itself: a network namespace joined to this one by a veth
pair, with addresses of the test's own (never this machine's interfaces). What runs
"on another machine" runs inside the namespace."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO, base_env, troupe_cmd

HOST_SIDE, STUDENT_SIDE = "10.77.0.1", "10.77.0.2"
CLONE_NEWNET = 0x40000000


def in_namespace(namespace: str) -> Callable[[], None]:
    """A ``preexec_fn`` that moves the process into ``namespace`` (a machine of the LAN:
    its own loopback, the LAN address, no route beyond, no name server)."""

    def enter() -> None:
        fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            os._exit(99)
        os.close(fd)

    return enter


def build_lan() -> Iterator[str]:
    """A namespace ``troupe-lan-*`` reaching this machine at 10.77.0.1 over a veth pair."""
    name, short = f"troupe-lan-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex[:6]
    # No IPv6 in the namespace: a link-local address that turns valid a second after its
    # link comes up (duplicate address detection) is a network change to a browser there,
    # which fails the requests in flight (net::ERR_NETWORK_CHANGED).
    quiet = "for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 /proc/sys/net/ipv6/conf/default/disable_ipv6; " \
            "do [ -e $f ] && echo 1 > $f; done; true"
    steps = [["ip", "netns", "add", name],
             ["ip", "netns", "exec", name, "sh", "-c", quiet],
             ["ip", "link", "add", f"tv{short}", "type", "veth", "peer", "name", f"tp{short}"],
             ["ip", "link", "set", f"tp{short}", "netns", name],
             ["ip", "addr", "add", f"{HOST_SIDE}/24", "dev", f"tv{short}"],
             ["ip", "link", "set", f"tv{short}", "up"],
             ["ip", "netns", "exec", name, "ip", "addr", "add", f"{STUDENT_SIDE}/24", "dev", f"tp{short}"],
             ["ip", "netns", "exec", name, "ip", "link", "set", f"tp{short}", "up"],
             ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"]]
    for step in steps:
        made = subprocess.run(step, capture_output=True, text=True)
        if made.returncode != 0:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            pytest.skip(f"cannot build a test LAN here ({' '.join(step)}: {made.stderr.strip()}); CI runs as root")
    try:
        yield name
    finally:
        subprocess.run(["ip", "link", "del", f"tv{short}"], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def student(namespace: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A terminal on a student's machine: inside the namespace, with a config of its own."""
    env = {**base_env(home), "XDG_CONFIG_HOME": str(home / "config"), "HOME": str(home)}
    return subprocess.run(["ip", "netns", "exec", namespace, *troupe_cmd(*args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def fetch(namespace: str, url: str, method: str = "GET", token: str | None = None, body: dict | None = None
          ) -> tuple[int, object]:
    """An HTTP request made from inside the namespace."""
    script = ("import json,sys,urllib.request as u\n"
              "r=u.Request(sys.argv[1],method=sys.argv[2],data=(sys.argv[4].encode() if sys.argv[4] else None),"
              "headers={'Content-Type':'application/json',**({'Authorization':'Bearer '+sys.argv[3]} "
              "if sys.argv[3] else {})})\n"
              "try:\n  x=u.urlopen(r,timeout=30); print(x.status); print(x.read().decode())\n"
              "except u.HTTPError as e:\n  print(e.code); print(e.read().decode())\n")
    done = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c", script, url, method, token or "",
                           json.dumps(body) if body is not None else ""], capture_output=True, text=True, timeout=60)
    status, _, text = done.stdout.partition("\n")
    try:
        return int(status), json.loads(text)
    except ValueError:
        return int(status or 0), text

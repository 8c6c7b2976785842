"""A private sshd on loopback for the SSH-session worker tests (RECIPES): its own host
key, one authorised user key, a free port, everything in one temporary folder. It needs
Debian's openssh-server and openssh-client (.ci/run installs them) and root (to log in
as root, the user the tests run as)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Sshd:
    port: int
    key: Path  # the authorised user's private key
    wrong_key: Path  # a key sshd does not know
    proc: subprocess.Popen[bytes]
    known_hosts: Path

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def missing() -> str | None:
    lacking = [tool for tool in ("ssh", "ssh-keygen") if shutil.which(tool) is None]
    if not Path("/usr/sbin/sshd").exists():
        lacking.append("sshd")
    if lacking:
        return f"SSH worker tests need Debian's openssh-server and openssh-client (.ci/run installs them); " \
               f"missing {', '.join(lacking)}"
    if os.geteuid() != 0:
        return "the private sshd lets its own user in as root only (CI runs as root)"
    return None


def start_sshd(folder: Path) -> Sshd:
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    for name in ("host", "user", "stranger"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True)
    (folder / "authorized_keys").write_text((folder / "user.pub").read_text())
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = folder / "sshd_config"
    config.write_text("\n".join((
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {folder / 'host'}",
        f"AuthorizedKeysFile {folder / 'authorized_keys'}", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "PermitRootLogin yes",
        "StreamLocalBindUnlink yes", "AllowStreamLocalForwarding yes", f"PidFile {folder / 'sshd.pid'}",
        "LogLevel ERROR")) + "\n")
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    known = folder / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {(folder / 'host.pub').read_text()}")
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return Sshd(port, folder / "user", folder / "stranger", proc, known)
        time.sleep(0.05)
    proc.terminate()
    raise RuntimeError("the private sshd did not start")

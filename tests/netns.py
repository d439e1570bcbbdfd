"""A small network of hosts for a test (issue 60): Linux network namespaces joined by veth
links to a bridge in a namespace of its own, each host with its own address in 10.77.0.0/24.

Nothing changes in the root namespace and no host has a route beyond that subnet, so
nothing outside this machine can be a target; a host's 127.0.0.1 is its own, so a service
bound to loopback on one host is out of reach of the others (as between real machines).
Processes run on a host through ``ip netns exec``; they share this machine's files, so a
host's working folder is a folder the test gives it.

Faults are changes to a host's link: `cut` takes its port off the bridge (its interface
stays up, frames go nowhere: new connections fail after ARP gives up, established ones
hang until their own timeouts, as across a real partition), `heal` puts it back. This
kernel has no netem qdisc and no netfilter tools: a slow link is a delaying proxy the test
runs (`tests/netns_proxy.py`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

SUBNET = "10.77.0"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def refusal() -> str | None:
    """Why this machine cannot build a network of namespaces (one line), or None."""
    probe = f"sapo-probe-{os.getpid()}"
    try:
        made = _ip("netns", "add", probe, check=False)
    except FileNotFoundError:
        return "no `ip` command (iproute2) here: network namespaces cannot be built"
    if made.returncode != 0:
        return f"the kernel refused a network namespace: {made.stderr.strip() or made.returncode}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    """One machine of the test's network."""

    name: str
    netns: str
    address: str
    port: str
    """Its link's end on the bridge (in the switch's namespace): what `cut` detaches."""
    processes: list[subprocess.Popen[Any]] = field(default_factory=list)

    def command(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def start(self, argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
        """A process on this host, stopped (with its group) when the network is removed."""
        popen.setdefault("start_new_session", True)
        process = subprocess.Popen(self.command(argv), **popen)
        self.processes.append(process)
        return process

    def python(self, code: str, *, timeout: float, env: dict[str, str] | None = None) -> str:
        """Run ``code`` with this interpreter on this host; its stdout (CalledProcessError
        with its stderr when it fails)."""
        done = subprocess.run(
            self.command([sys.executable, "-c", code]),
            capture_output=True, text=True, timeout=timeout, env=env,
        )  # fmt: skip
        if done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, "python", done.stdout, done.stderr)
        return done.stdout


class Network:
    """Hosts named ``names`` on one bridge, removed (with every process started on them)
    when the ``with`` block ends."""

    def __init__(self, names: Sequence[str]) -> None:
        self.tag = f"sp{os.getpid()}"
        self.switch = f"{self.tag}-switch"
        self.hosts: dict[str, Host] = {}
        self._names = list(names)

    def __enter__(self) -> Network:
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for i, name in enumerate(self._names):
                self.hosts[name] = self._add_host(name, i)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    @classmethod
    def attach(cls, tag: str, names: Sequence[str]) -> Network:
        """A handle on the network another process of this test built (its ``tag``, the
        same ``names``): for starting processes on its hosts, cutting and healing them.
        Removing the network stays with the process that built it."""
        net = cls(names)
        net.tag, net.switch = tag, f"{tag}-switch"
        net.hosts = {name: net._host(name, i) for i, name in enumerate(names)}
        return net

    def _host(self, name: str, i: int) -> Host:
        # interface names hold at most 15 characters
        return Host(name, f"{self.tag}-{name}", f"{SUBNET}.{10 + i}", f"{self.tag}p{i}")

    def _add_host(self, name: str, i: int) -> Host:
        host = self._host(name, i)
        netns, port, address = host.netns, host.port, host.address
        inside = f"{self.tag}h{i}"
        _ip("netns", "add", netns)
        _ip("link", "add", inside, "type", "veth", "peer", "name", port)
        _ip("link", "set", inside, "netns", netns)
        _ip("link", "set", port, "netns", self.switch)
        _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        _ip("-n", netns, "link", "set", inside, "name", "eth0")
        _ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        return host

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def cut(self, name: str) -> None:
        """Partition ``name`` from every other host (its link stays up, its frames vanish)."""
        _ip("-n", self.switch, "link", "set", self.hosts[name].port, "nomaster")

    def heal(self, name: str) -> None:
        _ip("-n", self.switch, "link", "set", self.hosts[name].port, "master", "br0")

    def __exit__(self, *_: object) -> None:
        from tests.conftest import stop_process_group

        for host in self.hosts.values():
            for process in host.processes:
                if process.poll() is None:
                    stop_process_group(process, timeout=10)
        for host in self.hosts.values():
            _ip("netns", "del", host.netns, check=False)
        _ip("netns", "del", self.switch, check=False)

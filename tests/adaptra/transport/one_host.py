"""A network namespace of a test's own for the delegates' NIC tests: one host, two NICs."""

import contextlib
import os
import subprocess
from collections.abc import Iterator


def ip_batch(namespace: str, commands: list[str]) -> None:
    """Run `ip` commands in `namespace`, in one process."""
    script = "".join(f"{command}\n" for command in commands)
    subprocess.run(["ip", "-n", namespace, "-batch", "-"], input=script, text=True, check=True)


@contextlib.contextmanager
def one_host_namespace() -> Iterator[str]:
    """A network namespace of the test's own, one host with two NICs, `nic0` (10.77.0.1) and
    `nic1` (10.77.1.1), and a third link, `flap`, nobody's NIC: each a veth whose peer is up
    in the namespace too (a link netlink sees go down and up; the addresses stay local)."""
    name = f"adt-delegate-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        commands = ["link set lo up"]
        for link in ("nic0", "nic1", "flap"):
            commands += [f"link add {link} type veth peer name {link}p", f"link set {link}p up"]
            commands.append(f"link set {link} up")
        commands += ["addr add 10.77.0.1/32 dev nic0", "addr add 10.77.1.1/32 dev nic1"]
        ip_batch(name, commands)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True)


@contextlib.contextmanager
def entered(namespace: str) -> Iterator[None]:
    """This thread in `namespace` (the processes it starts start there), then back."""
    from pyroute2 import netns

    netns.pushns(namespace)
    try:
        yield
    finally:
        netns.popns()

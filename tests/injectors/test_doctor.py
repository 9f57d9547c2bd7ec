import json
import os
import subprocess
import sys
import time

import pytest

from injectors.doctor import run_checks


def _namespaces() -> set[str]:
    """The probe's namespaces (a testbed of a test running beside this one is not ours)."""
    from pyroute2 import netns

    return {name for name in netns.listnetns() if name.startswith("adb-probe-")}


def test_every_missing_feature_says_what_it_means() -> None:
    checks = run_checks(
        probe_kernel=lambda: {"namespaces": (True, "ok"), "netem": (False, "no such qdisc")}
    )
    by_name = {c.name: c for c in checks}
    assert set(by_name) >= {
        "root",
        "namespaces",
        "netem",
        "htb",
        "u32",
        "tap",
        "per-link faults",
        "cuda",
        "rdma",
        "megatron-core",
    }
    if os.geteuid() == 0:
        assert by_name["namespaces"].ok and not by_name["netem"].ok
        assert "userspace delay wire" in by_name["netem"].consequence
        assert not by_name["htb"].ok  # the fake probe did not report it
        assert by_name["htb"].consequence.startswith("no bandwidth caps")
        if by_name["tap"].ok:
            assert by_name["per-link faults"].detail == (
                "userspace delay wire (no sch_netem, sch_htb, cls_u32)"
            )
    for check in checks:
        assert check.ok == (check.consequence == ""), check


@pytest.mark.skipif(os.geteuid() != 0, reason="the kernel is probed only as root")
def test_per_link_faults_need_namespaces_even_with_a_tap_device() -> None:
    """Root without CAP_NET_ADMIN (a container) cannot make namespaces: neither netem nor the
    userspace wire has a testbed to live in, whatever /dev/net/tun says."""
    every_module = {"netem": (True, "ok"), "htb": (True, "ok"), "u32": (True, "ok")}
    denied = {"namespaces": (False, "Operation not permitted"), **every_module}
    per_link = {c.name: c for c in run_checks(probe_kernel=lambda: denied)}["per-link faults"]
    assert (per_link.ok, per_link.detail, per_link.consequence) == (
        False,
        "no namespaces: Operation not permitted",
        "no network testbed",
    )
    allowed = {"namespaces": (True, "ok"), **every_module}
    per_link = {c.name: c for c in run_checks(probe_kernel=lambda: allowed)}["per-link faults"]
    if os.environ.get("ADAPTRA_BENCH_NETEM") != "0":
        assert (per_link.ok, per_link.detail) == (True, "kernel netem")


def test_doctor_checks_only_what_the_testbed_uses() -> None:
    """Caps are htb classes fed by u32 filters and random loss is netem's or the wire's:
    neither tbf nor iptables is used anywhere, so the doctor does not ask for them."""
    checks = {c.name: c for c in run_checks(probe_kernel=dict)}
    assert "tbf" not in checks and "iptables" not in checks
    assert not any("packet loss" in c.consequence for c in checks.values())
    if os.geteuid() == 0:  # else every kernel check says "needs root" and names no qdisc
        assert "htb" in checks["htb"].consequence and "u32" in checks["u32"].consequence


@pytest.mark.skipif(os.geteuid() != 0, reason="probing namespaces and qdiscs needs root")
def test_the_real_probe_leaves_no_namespace_behind() -> None:
    before = _namespaces()
    out = subprocess.run(
        [sys.executable, "-m", "harness", "doctor", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    # Measured on these machines: have namespaces and htb with u32, and no netem.
    assert found["root"]["ok"] and found["namespaces"]["ok"]
    assert found["htb"]["ok"] and found["u32"]["ok"]
    per_link = "kernel netem" if found["netem"]["ok"] else "userspace delay wire (no sch_netem)"
    if os.environ.get("ADAPTRA_BENCH_NETEM") != "0":
        assert found["per-link faults"]["detail"] == per_link
    # A probe of another process (a testbed's choice of netem, a test beside this one) may
    # hold a namespace of the same prefix for a moment; one the doctor left stays forever.
    deadline = time.monotonic() + 30
    while (_namespaces() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _namespaces() - before

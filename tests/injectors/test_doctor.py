import json
import os
import subprocess
import sys

import pytest

from injectors.doctor import run_checks


def _namespaces() -> set[str]:
    from pyroute2 import netns

    return set(netns.listnetns())


def test_every_missing_feature_says_what_it_means() -> None:
    checks = run_checks(
        probe_kernel=lambda: {"namespaces": (True, "ok"), "netem": (False, "no such qdisc")}
    )
    by_name = {c.name: c for c in checks}
    assert set(by_name) >= {
        "root",
        "namespaces",
        "netem",
        "tbf",
        "htb",
        "u32",
        "tap",
        "per-link faults",
        "iptables",
        "cuda",
        "rdma",
        "megatron-core",
    }
    if os.geteuid() == 0:
        assert by_name["namespaces"].ok and not by_name["netem"].ok
        assert "userspace delay wire" in by_name["netem"].consequence
        assert not by_name["tbf"].ok  # the fake probe did not report it
        if by_name["tap"].ok:
            assert by_name["per-link faults"].detail == "userspace delay wire (no sch_netem)"
    for check in checks:
        assert check.ok == (check.consequence == ""), check


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
    # Measured on these machines: have namespaces, tbf and htb with u32, and no netem.
    assert found["root"]["ok"] and found["namespaces"]["ok"]
    assert found["tbf"]["ok"] and found["htb"]["ok"] and found["u32"]["ok"]
    per_link = "kernel netem" if found["netem"]["ok"] else "userspace delay wire (no sch_netem)"
    if os.environ.get("ADAPTRA_BENCH_NETEM") != "0":
        assert found["per-link faults"]["detail"] == per_link
    assert _namespaces() == before

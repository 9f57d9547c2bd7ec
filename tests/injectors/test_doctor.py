import json
import os
import subprocess
import sys

import pytest

from injectors import doctor
from injectors.doctor import Check, run_checks


def _namespaces() -> set[str]:
    """The probe's namespaces (a testbed of a test running beside this one is not ours)."""
    from pyroute2 import netns

    return {name for name in netns.listnetns() if name.startswith("adb-probe-")}


def _owned_by(pid: int) -> set[str]:
    """The namespaces whose owner record names process `pid` (a probe writes its record
    before it makes its namespace and removes it after the namespace)."""
    from injectors.ownership import OwnerRecord

    return {name for r in OwnerRecord.read_all() if r.pid == pid for name in r.namespaces}


def _left_by_no_live_process(before: set[str]) -> set[str]:
    """The probe namespaces made since `before` that no running process owns: left behind.
    Another process's probe (a test worker beside this one, a `doctor` or a testbed's
    choice of netem) holds one, under its live owner record, only while it probes."""
    from injectors.ownership import OwnerRecord

    new = _namespaces() - before
    held = {n for r in OwnerRecord.read_all() if r.owner_alive() for n in r.namespaces}
    return (new - held) & _namespaces()  # a probe that ended meanwhile took its own away


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


@pytest.mark.parametrize("euid", [0, 1000])
def test_root_whose_probe_made_no_namespace_hears_untested_not_needs_root(
    monkeypatch: pytest.MonkeyPatch, euid: int
) -> None:
    """Where the probe cannot make a namespace (a container without CAP_SYS_ADMIN, no
    pyroute2) it reports "namespaces" alone: root was told netem, htb and u32 "need root".
    Not root, the kernel is not probed at all, and they do."""
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    denied = {"namespaces": (False, "could not create one (Operation not permitted)")}
    checks = {c.name: c for c in run_checks(probe_kernel=lambda: denied)}
    expected = "untested: no namespace to try it in" if euid == 0 else "needs root"
    for name in ("netem", "htb", "u32"):
        assert (checks[name].ok, checks[name].detail) == (False, expected)
    assert checks["namespaces"].detail == (
        "could not create one (Operation not permitted)" if euid == 0 else "needs root"
    )


def test_root_without_the_testbed_s_capabilities_hears_it_and_no_path_of_a_testbed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Root in a container made without CAP_NET_ADMIN and CAP_SYS_ADMIN: doctor said "ok
    root", and of the kernel modules it could not try that per-link faults would go
    through the userspace wire, where no testbed can be made at all."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(doctor, "_effective_capabilities", lambda: 1 << 12)  # NET_ADMIN only
    denied = {"namespaces": (False, "could not create one (mount rundir failed)")}
    checks = {c.name: c for c in run_checks(probe_kernel=lambda: denied)}
    assert checks["root"] == Check(
        "root",
        False,
        "euid 0 without CAP_SYS_ADMIN",
        "no network testbed: root in a container needs them (docker run --cap-add)",
    )
    assert checks["netem"].consequence == "no network testbed"
    assert checks["namespaces"].consequence == (
        "no network testbed; transport-level faults still work"
    )
    monkeypatch.setattr(doctor, "_effective_capabilities", lambda: (1 << 12) | (1 << 21))
    assert {c.name: c for c in run_checks(probe_kernel=lambda: denied)}["root"].ok


def test_root_with_namespaces_but_without_net_admin_hears_of_no_testbed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Root with CAP_SYS_ADMIN but not CAP_NET_ADMIN: the probe makes its namespace but no
    veth in it, and the testbed's bridges are refused. Doctor said "ok per-link faults:
    userspace delay wire (no sch_netem, sch_htb, cls_u32)", and of netem that per-link
    faults would all go through the wire: there is no testbed for either."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(doctor, "_effective_capabilities", lambda: 1 << 21)  # SYS_ADMIN only
    untested = (False, "untested: no veth pair to try it on (Operation not permitted)")
    probed = {
        "namespaces": (True, "created and removed one"),
        "netem": untested,
        "htb": untested,
        "u32": untested,
    }
    checks = {c.name: c for c in run_checks(probe_kernel=lambda: probed)}
    assert not checks["root"].ok
    assert checks["per-link faults"] == Check(
        "per-link faults", False, "euid 0 without CAP_NET_ADMIN", "no network testbed"
    )
    for name in ("netem", "htb", "u32"):
        assert checks[name].consequence == "no network testbed", checks[name]


@pytest.mark.parametrize(
    ("netem_env", "netem", "detail"),
    [
        ("0", True, "none: ADAPTRA_BENCH_NETEM=0 and no /dev/net/tun"),
        ("", False, "none: no sch_netem and no /dev/net/tun"),
    ],
)
def test_per_link_faults_without_a_tap_device_say_why_not_netem(
    monkeypatch: pytest.MonkeyPatch, netem_env: str, netem: bool, detail: str
) -> None:
    """Without /dev/net/tun and without netem for the testbed, no per-link fault path: with
    sch_netem present but ADAPTRA_BENCH_NETEM=0, doctor said "no sch_netem" (beside "ok
    netem")."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(doctor, "_effective_capabilities", lambda: (1 << 12) | (1 << 21))
    monkeypatch.setenv("ADAPTRA_BENCH_NETEM", netem_env)

    class NoTun(type(doctor.Path())):  # type: ignore[misc]
        def exists(self, *, follow_symlinks: bool = True) -> bool:
            return str(self) != "/dev/net/tun" and super().exists()

    monkeypatch.setattr(doctor, "Path", NoTun)
    ok = (True, "ok")
    probed = {"namespaces": ok, "netem": (netem, "probed"), "htb": ok, "u32": ok}
    checks = {c.name: c for c in run_checks(probe_kernel=lambda: probed)}
    assert checks["netem"].ok == netem
    assert (checks["per-link faults"].ok, checks["per-link faults"].detail) == (False, detail)
    # A timeline's cap is a wire state too: with no wire it fails as a delay does ("the wire
    # w0 ... could not start: no /dev/net/tun"), where doctor said "caps still work: htb".
    consequence = checks["per-link faults"].consequence
    assert "caps still work" not in consequence and "cap in the testbed" in consequence


def test_doctor_checks_only_what_the_testbed_uses() -> None:
    """Caps are htb classes fed by u32 filters and random loss is netem's or the wire's:
    neither tbf nor iptables is used anywhere, so the doctor does not ask for them."""
    namespaces_only = {"namespaces": (True, "created and removed one")}
    checks = {c.name: c for c in run_checks(probe_kernel=lambda: namespaces_only)}
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
    # hold a namespace of the same prefix meanwhile, under its live owner record; one the
    # doctor left has a dead owner (or none).
    assert not _left_by_no_live_process(before)


class _FakeIPRoute:
    """pyroute2's IPRoute in a namespace whose kernel answers tc with the errors `refusals`
    gives per qdisc or filter kind (a NetlinkError prints as an errno tuple)."""

    def __init__(self, refusals: dict[str, Exception], **_: object) -> None:
        self.refusals = refusals

    def __enter__(self) -> "_FakeIPRoute":
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def link(self, *_: object, **__: object) -> None:
        pass

    def link_lookup(self, **_: object) -> list[int]:
        return [1]

    def tc(self, command: str, kind: str, *_: object, **__: object) -> None:
        if kind in self.refusals:
            raise self.refusals[kind]


class _FakeNetns:
    def __init__(self, refusal: Exception | None = None) -> None:
        self.refusal = refusal

    def create(self, name: str) -> None:
        if self.refusal is not None:
            raise self.refusal

    def remove(self, name: str) -> None:
        pass


def _probe_with(
    monkeypatch: pytest.MonkeyPatch,
    refusals: dict[str, Exception],
    netns_refusal: Exception | None = None,
) -> dict[str, tuple[bool, str]]:
    import functools

    import pyroute2

    from injectors import kernel_probe
    from injectors.ownership import OwnerRecord

    monkeypatch.setattr(pyroute2, "IPRoute", functools.partial(_FakeIPRoute, refusals))
    monkeypatch.setattr(pyroute2, "netns", _FakeNetns(netns_refusal))
    monkeypatch.setattr(OwnerRecord, "write", lambda self: None)
    monkeypatch.setattr(OwnerRecord, "remove", lambda self: None)
    return kernel_probe.probe_kernel()


def test_the_probe_says_in_words_what_the_kernel_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's errors come back as words, never as pyroute2's `(2, '...')` tuple: an
    unknown qdisc or classifier kind (ENOENT) names the missing module."""
    from pyroute2 import NetlinkError

    found = _probe_with(monkeypatch, {"netem": NetlinkError(2), "u32": NetlinkError(2)})
    assert found == {
        "namespaces": (True, "created and removed one"),
        "netem": (False, "no sch_netem in this kernel (No such file or directory)"),
        "htb": (True, "a htb qdisc was attached"),
        "u32": (False, "no cls_u32 in this kernel (No such file or directory)"),
    }
    found = _probe_with(monkeypatch, {"htb": NetlinkError(1)})
    assert found["netem"] == (True, "a netem qdisc was attached")
    assert found["htb"] == (False, "a htb qdisc could not be attached (Operation not permitted)")
    assert found["u32"] == (
        False,
        "untested: no htb qdisc to filter for (Operation not permitted)",
    )
    found = _probe_with(monkeypatch, {}, PermissionError(1, "Operation not permitted"))
    assert found == {"namespaces": (False, "could not create one (Operation not permitted)")}


@pytest.mark.skipif(os.geteuid() != 0, reason="the kernel is probed only as root")
def test_the_real_probe_details_are_words() -> None:
    from injectors.kernel_probe import probe_kernel

    found = probe_kernel()
    for kind in ("netem", "htb", "u32"):
        present, detail = found[kind]
        if present:
            assert detail == f"a {kind} {'filter' if kind == 'u32' else 'qdisc'} was attached"
        else:  # these machines: no sch_netem
            assert not detail.startswith("("), detail
            module = {"netem": "sch_netem", "htb": "sch_htb", "u32": "cls_u32"}[kind]
            assert detail == f"no {module} in this kernel (No such file or directory)"


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_a_probe_namespace_it_could_not_remove_is_said_and_left_to_cleanup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probe's removal fails (a busy namespace): the check says so instead of the
    command crashing, and its owner record stays, so that `cleanup` removes it once the
    probing process is gone (while it runs, here, the namespace is in use)."""
    from pyroute2 import netns

    from injectors.kernel_probe import probe_kernel
    from injectors.ownership import OwnerRecord, cleanup

    before = _namespaces()
    real_remove = netns.remove

    def busy(name: str) -> None:
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr(netns, "remove", busy)
    try:
        found = probe_kernel()
    finally:
        monkeypatch.setattr(netns, "remove", real_remove)
    # This process's probe's, by its owner record: another process's probe (a test worker
    # beside this one, a `doctor`) may hold one of the same prefix meanwhile.
    mine = (_namespaces() - before) & _owned_by(os.getpid())
    try:
        ok, detail = found["namespaces"]
        assert not ok and detail.startswith("created one but could not remove it (")
        (left,) = mine
        report = cleanup(prefix=left)
        assert report.left == ((left, f"in use: its testbed's process {os.getpid()} still runs"),)
    finally:
        for name in mine:
            netns.remove(name)
        for record in OwnerRecord.read_all():
            if set(record.namespaces) & mine:
                record.remove()
    assert not mine & _namespaces()

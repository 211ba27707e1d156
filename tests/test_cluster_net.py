"""Where a lab host's Ray node listens, which ports it opens, and who may advertise a device — on a real Ray cluster in
network namespaces this test creates (tests/cluster_peer.py), without TLS (test_cluster.py runs with it).

- Ray 2.60's gRPC servers listen on every address whatever `--node-ip` says: a head whose namespace also holds an
  address the lab did not name is refused in one line, and comes up only with `--any-address`.
- Every port its nodes open is one devicelab pinned and printed (GCS, raylet, object manager, agents, workers).
- Without TLS the lab network carries gRPC's plaintext (the control for test_cluster.py's capture).
- Two workers started at once for one device: exactly one advertises it; the other is refused in one line.
- A worker without the lab's token, or with another one, is refused in one line."""

import subprocess
import sys

import pytest
from cluster_peer import Capture, LabNet, _ip, wait_for

from devicelab.cluster import node

ray = pytest.importorskip("ray", reason="the cluster tests need the [cluster] extra (ray)")
pytestmark = [pytest.mark.e2e]


@pytest.fixture
def net(tmp_path):
    n = LabNet(["w1", "w2"])
    if not n.create():
        pytest.skip("cannot create network namespaces and a bridge here (needs root)")
    yield n
    n.delete()


def _pinned(base: int, head: bool) -> set[int]:
    out: set[int] = set()
    for _, _, port in node.node_ports(base, head):
        out |= set(range(port[0], port[1] + 1)) if isinstance(port, tuple) else {port}
    return out


def _ports(net, label: str) -> set[int]:
    pre = net.prefix() if label == "head" else next(h.prefix() for h in net.hosts if h.name == label)
    ss = subprocess.run([*pre, "ss", "-ltnpH"], capture_output=True, text=True).stdout
    return {int(ln.split()[3].rsplit(":", 1)[1]) for ln in ss.splitlines() if "ray" in ln or "gcs_server" in ln}


def test_listening_ports_and_one_claim_per_device(tmp_path, net):
    lab = tmp_path / "lab.yaml"
    # one device both lab hosts can reach (this machine's own CPUs), placed on lab host w1
    lab.write_text(f"devices:\n  - {{name: shared, workdir: {tmp_path}/shared, lab_host: w1}}\n")
    # an address on the head's host that the lab does not name (as a workstation's Wi-Fi address would be)
    extra = f"{net.subnet.rsplit('.', 1)[0]}.250.9"
    assert _ip("-n", net.head_ns, "link", "add", "stray0", "type", "veth", "peer", "name", "stray1")
    assert _ip("-n", net.head_ns, "addr", "add", f"{extra}/32", "dev", "stray0")
    assert _ip("-n", net.head_ns, "link", "set", "stray0", "up")
    args = ["head", "--lab", lab, "--port", net.port, "--node-ip", net.head_ip, "--host", "head"]
    p = subprocess.run(
        [*net.prefix(), sys.executable, "-m", "devicelab.cli", *map(str, args), "--ray-arg=--num-cpus=1"],
        capture_output=True,
        text=True,
        timeout=300,
        env=net.env(),
    )
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]  # (Ray's own log lines go there too)
    assert p.returncode != 0 and len(err) == 1, p.stdout + p.stderr
    assert "Ray listens on every address" in err[0] and extra in err[0] and "--any-address" in err[0]
    assert not _ports(net, "head"), "the refused head's Ray was stopped"

    net.start_head(lab, tmp_path / "head.log", extra=["--any-address"])
    log = " ".join((tmp_path / "head.log").read_text().split())  # as read, whatever the console's wrapping
    assert f"TCP ports: GCS (head only) {net.port}, " in log and "Ray workers" in log
    cap = Capture(net.prefix(), tmp_path / "lab-network.raw", limit=5_000_000)
    w1, w2 = net.hosts
    # two workers for lab host w1's device, started at once (one of them on another machine by mistake)
    for h in (w1, w2):
        h.join(lab, tmp_path / f"cache-{h.name}", tmp_path / f"{h.name}.log", as_host="w1")
    wait_for(lambda: w1.worker.poll() is not None or w2.worker.poll() is not None, 180, "one worker to be refused")
    loser, winner = (w1, w2) if w1.worker.poll() is not None else (w2, w1)
    wait_for(lambda: net.advertised() == {"shared": "w1"}, 180, "the other to advertise the device", every=1)
    assert winner.worker.poll() is None and loser.worker.returncode != 0
    said = [ln for ln in (tmp_path / f"{loser.name}.log").read_text().splitlines() if ln.startswith("error:")]
    assert len(said) == 1 and "device shared is" in said[0] and "stop that worker first" in said[0], said
    # every port the nodes opened is a pinned one
    assert _ports(net, "head") and _ports(net, "head") <= _pinned(net.port, head=True)
    assert _ports(net, winner.name) and _ports(net, winner.name) <= _pinned(6379, head=False)
    # without TLS, the joins' gRPC crossed the lab network in clear
    assert b"PRI * HTTP/2.0" in cap.stop()
    # a worker without the lab's token, and one with another token: refused in one line, and nothing of it advertised
    for i, extra in enumerate(({}, {"RAY_AUTH_TOKEN": "0123456789abcdef" * 2})):
        home = tmp_path / f"home-{i}"
        home.mkdir()
        env = {k: v for k, v in net.env().items() if k != "RAY_AUTH_TOKEN"}
        cmd = ["worker", "--address", net.address, "--lab", lab, "--host", "w1"]
        p = subprocess.run(
            [*loser.prefix(), sys.executable, "-m", "devicelab.cli", *map(str, cmd)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**env, "HOME": str(home), **extra},
        )
        err = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
        assert p.returncode != 0 and len(err) == 1 and "authentication token" in err[0], p.stdout + p.stderr
    assert net.advertised() == {"shared": "w1"}


def test_make_certs_and_cert_write_a_ca_and_host_certificates(tmp_path):
    """`devicelab cert` on a folder without the CA says where to make it; a host's key is private and its
    certificate verifies against the lab's CA; a worker without its certificate is told how to get one."""
    from conftest import devicelab

    p = devicelab("cert", "--tls", tmp_path / "tls", "--host", "w1", "--ip", "10.0.0.2")
    assert p.returncode != 0 and "--make-certs" in p.stderr
    from devicelab.cluster import tls

    tls.make_ca(tmp_path / "tls")
    p = devicelab("cert", "--tls", tmp_path / "tls", "--host", "w1", "--ip", "10.0.0.2")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "tls" / "w1.key").stat().st_mode & 0o077 == 0
    v = subprocess.run(
        ["openssl", "verify", "-CAfile", tmp_path / "tls" / "ca.crt", tmp_path / "tls" / "w1.crt"],
        capture_output=True,
        text=True,
    )
    assert v.returncode == 0, v.stdout + v.stderr
    lab = tmp_path / "lab.yaml"
    lab.write_text("devices:\n  - {name: board, transport: ssh, host: 127.0.0.1, lab_host: w2}\n")
    p = devicelab("worker", "--lab", lab, "--address", "127.0.0.1:9", "--tls", tmp_path / "tls", "--host", "w2")
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode != 0 and len(err) == 1 and "w2.crt is missing" in err[0] and "devicelab cert" in err[0], err

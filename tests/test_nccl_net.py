"""NCCL's network as its own lines say it, judged per node (launch/jobs/nccl_net.py), and the
check at the first collective (--nccl-check: launch/node/nccl_net.sh read by the supervisor).

Every NCCL line here is quoted from a public log, its source beside it; where a line is made from
a real one (another provider in the same format), the test says so."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dtrain import ROOT, contract
from dtrain.launch.jobs import nccl_net, runplan, supervision
from dtrain.launch.jobs.nccl_net import Expect, NcclNet, parse, verdict

# timing bounds (a heartbeat, a supervisor's reaction): run with the cluster tests, not beside them (dtrain/suite.py)
pytestmark = pytest.mark.serial

# ---------------------------------------------------------------- real lines, with their sources

# NCCL 2.19 in a container without a net plugin (its internal plugin: IB or sockets)
NCCL_1231 = "https://github.com/NVIDIA/nccl/issues/1231"
NO_PLUGIN_OLD = ("VM-0-14-tencentos:162637:162637 [6] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared "
                 "object file: No such file or directory No plugin found (libnccl-net.so), using internal implementation")
# NCCL 2.21's wording of the same
NCCL_1504 = "https://github.com/NVIDIA/nccl/issues/1504"
NO_PLUGIN_NEW = (
    "678c7278cb2d:26023:26023 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)",
    "678c7278cb2d:26023:26023 [0] NCCL INFO NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared "
    "object file: No such file or directory : when loading libnccl-net.so",
    "678c7278cb2d:26023:26023 [0] NCCL INFO NET/Plugin: Using internal network plugin.",
)
# NCCL on sockets: the interface it took and the network it says
NCCL_1053 = "https://github.com/NVIDIA/nccl/issues/1053"
SOCKET = ("axa:3048391:3048566 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>",
          "axa:3048391:3048566 [0] NCCL INFO Using network Socket")
# two interfaces on sockets
NCCL_278 = "https://github.com/NVIDIA/nccl/issues/278"
SOCKET_TWO = "sh-01:98911:98911 [0] NCCL INFO NET/Socket : Using [0]enP1p1s0f0:10.30.0.127<0> [1]enP1p1s0f1:10.30.0.227<0>"
# 2 x p4d.24xlarge over EFA, aws-ofi-nccl 1.4.0 (its collnet lines are not a missing plugin)
NCCL_527 = "https://github.com/NVIDIA/nccl/issues/527"
EFA_OK = (
    "ip-10-216-179-193:641223:641223 [4] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v6 symbol.",
    "ip-10-216-179-87:417133:417180 [2] NCCL INFO NET/OFI Using aws-ofi-nccl 1.4.0aws",
    "ip-10-216-179-193:641223:641270 [4] NCCL INFO NET/OFI Running on p4d.24xlarge platform, Setting NCCL_TOPO_FILE "
    "environment variable to /opt/aws-ofi-nccl/share/aws-ofi-nccl/xml/p4d-24xl-topo.xml",
    "ip-10-216-179-87:417138:417176 [7] NCCL INFO NET/OFI Selected Provider is efa",
    "ip-10-216-179-87:417138:417176 [7] NCCL INFO Using network AWS Libfabric",
)
# p5en.48xlarge (16 EFA), a newer plugin: "Libfabric", the count in the provider line
NCCL_1597 = "https://github.com/NVIDIA/nccl/issues/1597"
EFA_16 = ("8h200-3:6310:6318 [0] NCCL INFO NET/OFI Selected Provider is efa (found 16 nics)",
          "8h200-2:6831:6840 [0] NCCL INFO Using network Libfabric")
# 1 EFA of a p4d.24xlarge's 4 (a pod given one EFA device), NCCL 2.27.3 and aws-ofi-nccl 1.16.2
TRAINING_ON_EKS = ("https://github.com/gnosia93/training-on-eks/blob/main/chapter/"
                   "c7-training-optimization-intra-topology.md")
EFA_1_OF_4 = (
    "llama-3-8b-node-0-0:188:585 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v10)",
    "llama-3-8b-node-0-0:188:585 [0] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v10 symbol.",
    "llama-3-8b-node-0-0:188:585 [0] NCCL INFO Successfully loaded external plugin libnccl-net.so",
    "llama-3-8b-node-0-0:188:585 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.16.2",
    "llama-3-8b-node-0-0:188:585 [0] NCCL INFO NET/OFI Running on p4d.24xlarge platform, topology file "
    "/opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml/p4d-24xl-topo.xml",
    "llama-3-8b-node-0-0:188:585 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 1 nics)",
    "llama-3-8b-node-0-0:188:585 [0] NCCL INFO Initialized NET plugin Libfabric",
    "llama-3-8b-node-0-0:188:585 [0] NCCL INFO Assigned NET plugin Libfabric to comm",
    "llama-3-8b-node-0-0:188:585 [0] NCCL INFO Using network Libfabric",
)
# aws-ofi-nccl over another libfabric provider (Slingshot's cxi)
DETERMINED_169 = "https://github.com/determined-ai/environments/pull/169"
CXI = "nid000019:51404:52019 [0] NCCL INFO NET/OFI Selected Provider is cxi"
# aws-ofi-nccl found no provider, NCCL fell back to sockets on two interfaces (quoted without NCCL's prefix)
EKS_54 = "https://github.com/aws-samples/aws-do-eks/pull/54"
OFI_FAILED = ("NET/OFI Using transport protocol RDMA (platform set)", "NET/OFI No eligible providers were found",
              "NET/OFI aws-ofi-nccl initialization failed", "NET/IB : No device found", "Initialized NET plugin Socket",
              "NET/Socket : Using [0]enp73s0:10.1.216.156<0> [1]pod-id-link0:169.254.170.23<0>")
# NCCL's own IB transport on RoCE
DEEPEP_143 = "https://github.com/deepseek-ai/DeepEP/issues/143"
IB = ("msm-h200-2:4009:4557 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [2]mlx5_2:1/RoCE "
      "[3]mlx5_3:1/RoCE [RO]; OOB eth0:10.0.40.96<0>",
      "msm-h200-2:4009:4557 [0] NCCL INFO Using network IB")
# CloudWatch's timestamp before NCCL's prefix (SageMaker)
OFI_889 = "https://github.com/aws/aws-ofi-nccl/issues/889"
CLOUDWATCH = ("  | 2025-05-22T14:26:33.405-07:00 | ip-10-36-22-140:80:2500 [0] NCCL INFO NET/OFI Running on "
              "p4d.24xlarge platform, Setting NCCL_TOPO_FILE environment variable to "
              "/opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml/p4d-24xl-topo.xml")

# a WARN line of aws-ofi-nccl (NCCL writes it to NCCL_DEBUG_FILE too)
OFI_1020 = "https://github.com/aws/aws-ofi-nccl/issues/1020"
WARN = ("ip-172-31-3-90:1929:1937 [0] nccl_net_ofi_rdma_init:7978 NCCL WARN NET/OFI OFI fi_getinfo() call failed: "
        "No data available")

# the old plugin's device count (aws-ofi-nccl 2020), in libfabric's CI log
LIBFABRIC_5698 = "https://github.com/ofiwg/libfabric/pull/5698"
NDEV = ("INFO: Function: ofi_init Line: 742: NET/OFI Forcing AWS OFI ndev 4",
        "INFO: Function: ofi_init Line: 757: NET/OFI Selected Provider is efa")
# the newer wording with libfabric's efa-direct fabric (ofiwg/libfabric#10735): no public log of it
# was found; the format as launch/troubleshoot/network.py quotes it
EFA_DIRECT = "node-1:1:1 [0] NCCL INFO NET/OFI Selected Provider is efa, fabric is efa-direct (found 4 nics)"

P4D = Expect("p4d.24xlarge", efa=4, devices=4, memlock="unlimited")


def test_socket_in_a_container_without_the_plugin():
    """NCCL_1231 + NCCL_1053: no libnccl-net.so, NCCL on its socket transport."""
    net = parse([NO_PLUGIN_OLD, *SOCKET])
    assert net == NcclNet(network="Socket", name="Socket", nics=1, interfaces=("lo",), plugin="internal",
                          missing="libnccl-net.so")
    assert parse([*NO_PLUGIN_NEW, *SOCKET]).missing == "libnccl-net.so"  # NCCL_1504's wording


def test_the_ofi_plugin_over_efa_with_its_version():
    """NCCL_527: aws-ofi-nccl 1.4.0 on a p4d, provider efa; its collnet line is not a missing plugin."""
    net = parse(EFA_OK)
    assert (net.network, net.name, net.provider, net.plugin, net.version, net.missing, net.platform) == (
        "OFI", "AWS Libfabric", "efa", "aws-ofi-nccl", "1.4.0aws", "", "p4d.24xlarge")
    assert net.nics is None  # this plugin's line has no count
    assert verdict(net, P4D).ok


def test_the_count_of_nics_in_the_newer_providers_line():
    """NCCL_1597: `(found 16 nics)` on a p5en.48xlarge (16 EFA): OK; on a type of 32, fewer."""
    net = parse(EFA_16)
    assert (net.network, net.provider, net.nics, net.name) == ("OFI", "efa", 16, "Libfabric")
    assert verdict(net, Expect("p5en.48xlarge", 16, 16)).ok
    v = verdict(net, Expect("p5.48xlarge", 32, 32))
    assert (v.ok, v.cause) == (False, "efa-fewer")


def test_efa_with_1_of_4_nics_on_a_p4d():
    """The issue's case (about 20 GB/s busbw instead of 78), TRAINING_ON_EKS's log: NCCL 2.27's
    plugin lines, `found 1 nics` on a p4d.24xlarge. Where the node has 1 EFA device the instance
    was launched with one interface; where it has 4, NCCL (libfabric) was narrowed to one; from a
    log alone (devices unknown) the type's count is what it is held to."""
    net = parse(EFA_1_OF_4)
    assert (net.network, net.name, net.provider, net.nics, net.plugin, net.version, net.platform) == (
        "OFI", "Libfabric", "efa", 1, "aws-ofi-nccl", "1.16.2", "p4d.24xlarge")
    assert net.said() == "OFI (aws-ofi-nccl 1.16.2) provider efa, 1 NIC(s)"
    v = verdict(net, Expect("p4d.24xlarge", 4, devices=-1))
    assert v.cause == "efa-fewer" and v.why == "NCCL found 1 of the 4 EFA interfaces p4d.24xlarge has"
    v = verdict(net, Expect("p4d.24xlarge", 4, devices=1))
    assert (v.ok, v.cause) == (False, "efa-fewer") and "1 of the 4 EFA devices its type takes" in v.why
    assert "one EFA interface per network card" in v.fix
    v = verdict(net, Expect("p4d.24xlarge", 4, devices=4, env=(("FI_EFA_IFACE", "rdmap16s27"),)))
    assert v.cause == "efa-fewer" and "NCCL found 1 of the 4" in v.why and "FI_EFA_IFACE" in v.fix


def test_ofi_over_another_provider_instead_of_efa():
    """DETERMINED_169's line (cxi); the tcp and sockets providers print the same line (aws-ofi-nccl's
    format, the tcp name as libfabric gives it with rxm, as in the checklist's efa-not-selected)."""
    for line in (CXI, CXI.replace("cxi", "tcp;ofi_rxm") + " (found 1 nics)", CXI.replace("cxi", "sockets")):
        net = parse([line, EFA_OK[-1]])
        assert net.network == "OFI" and net.provider != "efa"
        v = verdict(net, P4D)
        assert (v.ok, v.cause) == (False, "efa-not-selected"), line
        assert "efa provider did not come up" in v.why
    net = parse([CXI, EFA_OK[-1]])
    assert verdict(net, Expect()).ok  # no EFA expected: any provider
    v = verdict(net, Expect("p4d.24xlarge", 4, 4, "unlimited", env=(("FI_PROVIDER", "tcp"),)))
    assert "FI_PROVIDER=tcp" in v.why and "unset" in v.fix


def test_the_plugin_gave_up_and_nccl_fell_back_to_sockets():
    """EKS_54: aws-ofi-nccl found no provider; the cause is read from the container."""
    net = parse(OFI_FAILED)
    assert (net.network, net.interfaces, net.nics) == ("Socket", ("enp73s0", "pod-id-link0"), 2)
    assert net.ofi_error == "aws-ofi-nccl initialization failed"
    assert net.plugin == "aws-ofi-nccl"  # loaded: it logged
    no_devices = verdict(net, Expect("p4d.24xlarge", 4, devices=0))
    assert no_devices.cause == "efa-unused" and "no /dev/infiniband/uverbs*" in no_devices.why
    capped = verdict(net, Expect("p4d.24xlarge", 4, devices=4, memlock="65536"))
    assert capped.cause == "memlock" and "65536 KiB" in capped.why and "LimitMEMLOCK=infinity" in capped.fix


def test_socket_without_the_plugin_on_an_efa_type_names_the_image():
    v = verdict(parse([NO_PLUGIN_OLD, *SOCKET]), P4D)
    assert (v.ok, v.cause) == (False, "efa-unused")
    assert "libnccl-net.so not found" in v.why and "dtrain GPU image" in v.fix
    assert verdict(parse([*NO_PLUGIN_NEW, *SOCKET]), Expect()).ok  # no EFA on the node: sockets are its network


def test_ib_is_fine_without_efa_and_wrong_on_an_efa_type():
    """DEEPEP_143: NCCL's IB transport on RoCE NICs."""
    net = parse(IB)
    assert (net.network, net.nics) == ("IB", 4) and net.interfaces[0] == "mlx5_0:1/RoCE"
    assert verdict(net, Expect()).ok
    assert verdict(net, P4D).cause == "efa-unused"


def test_older_and_newer_plugins_count_their_nics():
    """LIBFABRIC_5698: the old plugin's `Forcing AWS OFI ndev 4`; the efa-direct wording."""
    old = parse([*NDEV, EFA_OK[-1]])
    assert (old.provider, old.nics) == ("efa", 4) and verdict(old, P4D).ok
    new = parse([EFA_DIRECT, EFA_16[1]])
    assert (new.provider, new.nics) == ("efa", 4) and verdict(new, P4D).ok


def test_prefixes_of_other_tools_are_skipped():
    """OFI_889: CloudWatch's timestamp before NCCL's own prefix; NCCL_278: two socket interfaces."""
    assert parse([CLOUDWATCH]).platform == "p4d.24xlarge"
    assert parse([SOCKET_TWO, "x:1:1 [0] NCCL INFO Using network Socket"]).interfaces == ("enP1p1s0f0", "enP1p1s0f1")
    assert parse(["[1,0]<stdout>:" + EFA_16[0]]).nics == 16  # mpirun's tag


def test_nothing_said_yet_is_no_verdict():
    assert parse(["x:1:1 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>"]) == NcclNet()
    assert verdict(NcclNet(), P4D).ok


# ---------------------------------------------------------------- the verdict table

@pytest.mark.parametrize("lines, expect, ok, cause", [
    (EFA_OK, P4D, True, ""),
    (EFA_16, Expect("p5en.48xlarge", 16, 16), True, ""),
    (EFA_1_OF_4, P4D, False, "efa-fewer"),
    (EFA_1_OF_4, Expect("g5.48xlarge", 1, 1), True, ""),
    ([EFA_16[0].replace("16", "1"), EFA_16[1]], P4D, False, "efa-fewer"),
    ([CXI, EFA_OK[-1]], P4D, False, "efa-not-selected"),
    ([NO_PLUGIN_OLD, *SOCKET], P4D, False, "efa-unused"),
    ([NO_PLUGIN_OLD, *SOCKET], Expect("g5.xlarge"), True, ""),
    (OFI_FAILED, Expect("p4d.24xlarge", 4, 0), False, "efa-unused"),
    (OFI_FAILED, Expect("p4d.24xlarge", 4, 4, "64"), False, "memlock"),
    (OFI_FAILED, Expect("p4d.24xlarge", 4, 4, "unlimited", (("FI_PROVIDER", "sockets"),)), False, "efa-not-selected"),
    (IB, P4D, False, "efa-unused"),
    (IB, Expect(), True, ""),
    # an unknown type with EFA devices: the devices are the expectation
    (EFA_16, Expect("", 0, 16), True, ""),
    ([NO_PLUGIN_OLD, *SOCKET], Expect("", 0, 1), False, "efa-unused"),
])
def test_the_verdict_table(lines, expect, ok, cause):
    v = verdict(parse(lines), expect)
    assert (v.ok, v.cause) == (ok, cause)
    if not ok:  # every cause is a checklist entry
        from dtrain.launch.troubleshoot.checklist import ENTRIES

        assert cause in {e.id for e in ENTRIES} and v.why and v.fix
        assert f"docs/troubleshooting.md#{cause}" in nccl_net.line("node-1", v)


def test_fails_only_where_it_should():
    bad = verdict(parse([NO_PLUGIN_OLD, *SOCKET]), P4D)
    assert nccl_net.fails("fail", bad, P4D) and nccl_net.fails("auto", bad, P4D)
    assert not nccl_net.fails("warn", bad, P4D)
    soft = verdict(parse(IB), Expect("", 0, 0))
    assert soft.ok and not nccl_net.fails("fail", soft, Expect())


def test_mode_by_flag_nodes_and_the_users_variables():
    assert nccl_net.mode(None, True, ["A"]) == ("auto", "")
    assert nccl_net.mode(None, False, []) == ("off", "")  # no GPU: nothing to say
    assert nccl_net.mode("fail", False, [])[0] == "off" and "no GPU" in nccl_net.mode("fail", False, [])[1]
    assert nccl_net.mode("warn", True, []) == ("warn", "")
    assert nccl_net.mode(None, True, [], nodes=1) == ("warn", "")  # one node: the network carries nothing
    assert nccl_net.mode("fail", True, [], nodes=1) == ("fail", "")
    assert nccl_net.mode("off", True, []) == ("off", "")
    off, why = nccl_net.mode(None, True, ["NCCL_DEBUG", "X"])
    assert off == "off" and "NCCL_DEBUG set by --env" in why
    assert dict(nccl_net.debug_env("/dtrain-job")) == {
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": "/dtrain-job/nccl.%h.%p"}


# ---------------------------------------------------------------- the node's report and the event

def _report(itype: str, uverbs: int, files: dict[str, list[str]], memlock: str = "unlimited", env: str = "") -> str:
    head = [f"itype={itype}", f"uverbs={uverbs}", f"memlock={memlock}", *([f"env {env}"] if env else [])]
    return "\n".join(head + [x for name, lines in files.items() for x in (f"file={name}", *lines)]) + "\n"


EFA_TYPES = {"p4d.24xlarge": 4, "p5.48xlarge": 32}


def test_a_node_is_judged_by_its_worst_rank():
    text = _report("p4d.24xlarge", 4, {"nccl.a.1": list(EFA_OK), "nccl.a.2": [NO_PLUGIN_OLD, *SOCKET], "nccl.a.3": []})
    v, e, ranks = nccl_net.judge_node(text, EFA_TYPES)
    assert (v.ok, v.cause, ranks, e.want) == (False, "efa-unused", 2, 4)
    v, e, ranks = nccl_net.judge_node(_report("m7i.large", 0, {}), EFA_TYPES)
    assert v.ok and ranks == 0 and e.efa == 0
    e = nccl_net.expect_of(["itype=p4d.24xlarge", "uverbs=2", "memlock=64", "env FI_PROVIDER=tcp", "env SECRET=x"],
                           EFA_TYPES)
    assert e == Expect("p4d.24xlarge", 4, 2, "64", (("FI_PROVIDER", "tcp"),))  # only the names it asks


def test_the_event_and_its_line():
    said = {"node-1": _report("p4d.24xlarge", 4, {"nccl.node-1.7": list(EFA_OK)}),
            "node-2": _report("p4d.24xlarge", 4, {"nccl.node-2.9": [NO_PLUGIN_OLD, *SOCKET]}),
            "node-3": _report("p4d.24xlarge", 4, {})}
    fields, bad = nccl_net.event_fields("auto", said, EFA_TYPES)
    assert bad == ["node-2"] and fields["fails"] == ["node-2"]
    ev = json.loads(json.dumps({"event": "nccl-net", **fields}))
    line = supervision.describe(ev)
    assert line.startswith("[launch] NCCL network mismatch on node-2 (efa-unused): Socket on lo")
    assert "expected EFA x4 (p4d.24xlarge)" in line and "fix: use a dtrain GPU image" in line
    assert "goes on" not in line
    warned = nccl_net.event_line({**ev, "check": "warn", "fails": []})
    assert warned.endswith("(--nccl-check warn: the job goes on)")
    assert nccl_net.summary(fields) == "node-2: Socket on lo (libnccl-net.so not found: no net plugin) (efa-unused)"
    assert "NCCL network mismatch on node-2 (efa-unused)" in nccl_net.failure(fields, bad)
    ok, _ = nccl_net.event_fields("auto", {h: said["node-1"] for h in ("node-1", "node-2")}, EFA_TYPES)
    assert nccl_net.event_line(ok) == ("NCCL network on node-1, node-2: OFI (aws-ofi-nccl 1.4.0aws) provider efa; "
                                       "expected EFA x4 (p4d.24xlarge): OK")
    none, _ = nccl_net.event_fields("auto", {"node-1": _report("", 0, {})}, EFA_TYPES)
    assert "not checked" in nccl_net.event_line(none) and nccl_net.summary(none) == "not checked"


# ---------------------------------------------------------------- the wiring: nccl_net.sh and the supervisor

_spec = importlib.util.spec_from_file_location("supervise_nccl", ROOT / "launch" / "node" / "supervise.py")
sv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sv)


def _rank(job_dir: Path, lines: list[str], after: float, env: dict[str, str]) -> subprocess.Popen:
    """A stand-in rank: a process that, `after` seconds in, writes NCCL's debug file as NCCL does
    with NCCL_DEBUG_FILE=<job dir>/nccl.%h.%p (its hostname, its pid), then lives on."""
    code = ("import os, socket, sys, time; time.sleep(float(sys.argv[2])); "
            "p = os.path.join(sys.argv[1], 'nccl.%s.%d' % (socket.gethostname().split('.')[0], os.getpid())); "
            "f = open(p, 'w'); f.write(sys.stdin.read()); f.close(); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(job_dir), str(after)], stdin=subprocess.PIPE, text=True,
                            env={**os.environ, **env})
    proc.stdin.write("\n".join(lines) + "\n")
    proc.stdin.close()
    return proc


def _dmi() -> str:
    try:
        return Path("/sys/devices/virtual/dmi/id/product_name").read_text().strip()
    except OSError:
        return ""


def test_nccl_net_sh_waits_for_the_network_line_then_reports(tmp_path):
    rank = _rank(tmp_path, [NO_PLUGIN_OLD, "x:1:1 [0] NCCL INFO cudaDriverVersion 12020", *SOCKET, WARN], 0.5,
                 {"FI_PROVIDER": "tcp", "SECRET_TOKEN": "s3cret"})
    try:
        r = subprocess.run(["bash", str(contract.NODE_SCRIPTS / "nccl_net.sh"), str(tmp_path), "20", *nccl_net.RANK_VARS],
                           capture_output=True, text=True, timeout=60)
    finally:
        rank.kill()
    assert r.returncode == 0, r.stderr
    parts = nccl_net.split_files(r.stdout)
    info = parts.pop("")
    assert f"itype={_dmi()}" in info and "env FI_PROVIDER=tcp" in info and "s3cret" not in r.stdout
    assert any(x.startswith("uverbs=") for x in info) and any(x.startswith("memlock=") for x in info)
    [(name, lines)] = parts.items()
    assert name == f"nccl.{os.uname().nodename.split('.')[0]}.{rank.pid}"
    assert lines == [NO_PLUGIN_OLD, *SOCKET, WARN]  # its INIT/NET and WARN lines only
    t0 = time.monotonic()  # nothing written: it gives up after WAIT_S
    r = subprocess.run(["bash", str(contract.NODE_SCRIPTS / "nccl_net.sh"), str(tmp_path / "none"), "1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "file=" not in r.stdout and time.monotonic() - t0 < 5


def _plan(check: str) -> runplan.RunPlan:
    nodes = [runplan.PlanNode("127.0.0.1", "node-1", 1, "lo", gpus=8), runplan.PlanNode("127.0.0.2", "node-2", 1, "lo", gpus=8)]
    plan = runplan.RunPlan(runplan.LaunchCommand("mpirun", ("python", "t.py"), job="j"), tuple(nodes),
                           nccl_check=check, efa_types=((_dmi(), 4),))
    return runplan.RunPlan.from_json(json.loads(json.dumps(plan.to_json())))  # as the supervisor reads it


def _supervisor(tmp_path, monkeypatch, check: str, dirs: dict[str, Path]):
    """The supervisor with its job dir in tmp_path; node-2's container is a directory of its own
    here (its `ssh` runs the same command locally on that directory)."""
    monkeypatch.setattr(sv, "JOB_DIR", str(dirs["node-1"]))
    monkeypatch.setattr(nccl_net, "WAIT_S", 20)
    sup = sv.Supervisor(_plan(check), tmp_path)
    sup.remote = lambda node, line, **kw: ["bash", "-c", line.replace(str(dirs["node-1"]), str(dirs[node.hostname]))]
    return sup


def test_the_supervisor_ends_the_job_within_seconds_of_a_wrong_network(tmp_path, monkeypatch):
    """--nccl-check auto on a node whose type has EFA (this machine's DMI name, 4 EFA in the
    plan's table; no EFA device here): rank 0 on node-1 says OFI over tcp (FI_PROVIDER=tcp in its
    environment), node-2's rank NCCL's sockets without a plugin. One `nccl-net` event naming both,
    the attempt ends (watch) a few seconds after the line, and the job fails without a restart."""
    dirs = {h: tmp_path / h for h in ("node-1", "node-2")}
    for d in dirs.values():
        d.mkdir()
    sup = _supervisor(tmp_path, monkeypatch, "auto", dirs)
    nodes = sup.plan.nodes
    ranks = [_rank(dirs["node-1"], [CXI.replace("cxi", "tcp;ofi_rxm") + " (found 1 nics)", EFA_OK[-1]], 1.0,
                   {"FI_PROVIDER": "tcp"}),
             _rank(dirs["node-2"], [NO_PLUGIN_OLD, *SOCKET, WARN], 1.0, {})]
    sup.procs = [subprocess.Popen(["sleep", "60"])]  # the attempt's launcher
    sup.state["restarts"] = 0
    try:
        t0 = time.monotonic()
        sv.check_nccl(sup, nodes)
        end = sup.watch(nodes, ())
        took = time.monotonic() - t0
    finally:
        for p in (*ranks, *sup.procs):
            p.kill()
    assert took < 8  # 1 s to the line, 2 s for the node's other ranks, the reads
    assert end.code == 1 and "NCCL network mismatch on node-1, node-2" in end.fatal
    events = [json.loads(x[len(supervision.EVENT):]) for x in (tmp_path / "output.log").read_text().splitlines()
              if x.startswith(supervision.EVENT)]
    [ev] = [e for e in events if e["event"] == "nccl-net"]
    assert ev["fails"] == ["node-1", "node-2"]
    assert ev["nodes"]["node-1"]["cause"] == "efa-not-selected" and "FI_PROVIDER=tcp" in ev["nodes"]["node-1"]["why"]
    assert ev["nodes"]["node-2"]["cause"] == "efa-unused"
    state = json.loads((tmp_path / "state.json").read_text())
    assert "node-1: OFI" in state["nccl"] and state.get("state") != "nccl-net"  # the job's state is not the check's
    raw = (tmp_path / "output.log").read_text()
    assert f"{contract.STACK_LINE}[node-2] {WARN}\n" in raw  # NCCL's WARN back in the job's log
    from dtrain.launch.troubleshoot.diagnose import diagnose

    render = supervision.Render("mpirun", "node-1")
    log = "\n".join(x for line in raw.splitlines() for x in render.feed(line))  # as dtrain logs shows it
    found = {f.entry.id: f for f in diagnose(log)}
    assert found["efa-not-selected"].nodes == ("node-1",) and "efa-unused" in found
    shown = supervision.Render("mpirun", "node-1")
    assert shown.feed(sv.EVENT + json.dumps(ev))[0].startswith("[launch] NCCL network mismatch on node-1 (efa-not-selected)")


def test_warn_and_a_right_network_let_the_job_run(tmp_path, monkeypatch):
    dirs = {h: tmp_path / h for h in ("node-1", "node-2")}
    for d in dirs.values():
        d.mkdir()
    for check, lines in (("warn", [NO_PLUGIN_OLD, *SOCKET]), ("fail", [EFA_16[0].replace("16", "4"), EFA_16[1]])):
        sup = _supervisor(tmp_path, monkeypatch, check, dirs)
        ranks = [_rank(d, lines, 0.2, {}) for d in dirs.values()]
        sup.state["restarts"] = 0
        try:
            sv.check_nccl(sup, sup.plan.nodes)
        finally:
            for p in ranks:
                p.kill()
        assert sup.nccl_fatal is None, check
        for d in dirs.values():
            for f in d.iterdir():
                f.unlink()


# ---------------------------------------------------------------- dtrain diagnose

def test_diagnose_says_what_nccl_chose_and_why():
    """The efa entries' findings carry what the parser reads from the log; where aws-ofi-nccl named
    the instance type (NCCL_527's platform line), the likely cause against it."""
    from dtrain.launch.troubleshoot.diagnose import diagnose, diagnose_file, format_report

    [f] = diagnose_file(ROOT / "tests" / "logs" / "efa-unused.log")
    assert f.entry.id == "efa-unused"
    assert f.notes == ("nccl: NCCL's network: Socket (aws-ofi-nccl: aws-ofi-nccl initialization failed)",)
    [f] = diagnose_file(ROOT / "tests" / "logs" / "efa-not-selected.log")
    assert f.notes == ("nccl: NCCL's network: OFI (aws-ofi-nccl 1.14.0) provider tcp;ofi_rxm, 1 NIC(s)",)
    log = "\n".join([EFA_OK[2], CXI, EFA_OK[-1]])
    [f] = diagnose(log)
    assert f.entry.id == "efa-not-selected"
    assert f.notes[1].startswith("nccl: on p4d.24xlarge (EFA x4 (p4d.24xlarge)): likely libfabric's efa provider")
    assert "\n   nccl: NCCL's network: OFI (aws-ofi-nccl) provider cxi" in format_report([f])
    log = "\n".join([*NO_PLUGIN_NEW, SOCKET_TWO, SOCKET[1]])  # no type said: what NCCL chose, no cause guessed
    [f] = diagnose(log)
    assert f.entry.id == "efa-unused"
    assert f.notes == ("nccl: NCCL's network: Socket on enP1p1s0f0 enP1p1s0f1 (libnccl-net.so not found: no net plugin); "
                       "plugin internal",)


def test_the_run_report_shows_the_check():
    from dtrain.launch.analysis import report

    line = "[launch] NCCL network mismatch on node-2 (efa-unused): Socket on lo <b>"
    page = report.html(report.read({"name": "j", "state": "failed"}, f"[launch] job started\n{line}\n"))
    assert '<p class="note nccl">NCCL network mismatch on node-2 (efa-unused): Socket on lo &lt;b&gt;</p>' in page
    assert 'class="note nccl"' not in report.html(report.read({"name": "j"}, "[launch] job started\n"))


# ---------------------------------------------------------------- the flag

def _dtrain(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dtrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), "AWS_EC2_METADATA_DISABLED": "true"})


def test_a_bad_nccl_check_is_one_line_from_the_flag_and_the_file(tmp_path):
    (tmp_path / "job.yaml").write_text("image: reg/x:1\nhosts: h1:1\ncommand: python t.py\nnccl_check: sometimes\n")
    (tmp_path / "job2.yaml").write_text("image: reg/x:1\nhosts: h1:1\ncommand: python t.py\n")
    for r, head in ((_dtrain(tmp_path, "launch", "-f", "job.yaml"), "error: job.yaml:4: nccl_check: "),
                    (_dtrain(tmp_path, "launch", "-f", "job2.yaml", "--nccl-check", "sometimes"), "error: --nccl-check ")):
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith(head) and "warn" in r.stderr and "fail" in r.stderr and "off" in r.stderr, r.stderr
    r = _dtrain(tmp_path, "launch", "-f", "job2.yaml", "--target", "sagemaker", "--instance-type", "ml.p4d.24xlarge",
                "--role", "arn:aws:iam::123456789012:role/r", "--nccl-check", "warn")
    assert r.returncode == 2 and "--nccl-check: not for --target sagemaker" in r.stderr, r.stderr


def test_the_launch_gives_the_ranks_nccls_debug_file_only_where_it_checks():
    """session.supervisor_plan: GPU nodes get the check (auto) and NCCL's variables in every rank's environment;
    CPU nodes, --nccl-check off and a job that sets NCCL_DEBUG itself get neither."""
    from dtrain.launch import targets
    from dtrain.launch.jobs import config
    from dtrain.launch.jobs import launchers, session
    from dtrain.launch.jobs.spec import NodeFacts, Started
    from dtrain.launch.remote.hosts import Node

    def plan(gpus: int, **cfg):
        spec = config.job_spec(config.build({"image": "reg/x:1", "command": ["python", "t.py"], **cfg}),
                               efa_types=targets.efa_types())  # what the nodes target gives
        facts = [NodeFacts(Node(f"10.0.0.{i}", 8), f"10.0.0.{i}", f"node-{i}", "ens5", gpus, (), "") for i in (1, 2)]
        return session.supervisor_plan(spec, launchers.get(spec.launcher), Started(facts, "sha256:x", 4),
                                       {"10.0.0.1": "/d"}, 4)

    p = plan(8)
    assert p.nccl_check == "auto" and dict(p.efa_types)["p4d.24xlarge"] == 4 and dict(p.efa_types)["p5.48xlarge"] == 32
    assert dict(p.run.extra_env)["NCCL_DEBUG_FILE"] == "/dtrain-job/nccl.%h.%p"
    assert plan(8, nccl_check="warn").nccl_check == "warn"
    for off in (plan(0), plan(8, nccl_check="off"), plan(8, env=["NCCL_DEBUG=INFO"])):
        assert off.nccl_check == "" and "NCCL_DEBUG_FILE" not in dict(off.run.extra_env)

"""A spare that joins a running job (issue 49: a node the Auto Scaling group brings back becomes a
warm spare): the line the launcher sends the supervisor, read back and checked, and the merge
that takes only a node the run does not know (launch/jobs/runplan.py)."""

from __future__ import annotations

import json

import pytest

from dtrain.launch.jobs import runplan
from dtrain.launch.jobs.runplan import PlanNode

N1, N2, N3, N4 = (PlanNode(f"10.0.0.{i}", f"node-{i}", 2, "ens5") for i in (1, 2, 3, 4))


def test_a_spare_line_reads_back_as_the_node():
    line = runplan.spare_line(PlanNode("10.0.0.9", "ip-10-0-0-9.ec2.internal", 8, "ens32", gpus=8))
    assert line.startswith(runplan.SPARE_LINE) and line.endswith("\n") and line.count("\n") == 1
    assert runplan.parse_spare_line(line.rstrip("\n")) == PlanNode("10.0.0.9", "ip-10-0-0-9.ec2.internal", 8, "ens32", 8)


@pytest.mark.parametrize("fields, message", [
    ({"address": "10.0.0.9; rm -rf /"}, "address: not an IP address"),
    ({"address": None}, "address: not an IP address"),
    ({"hostname": "node 9"}, "hostname: not a hostname"),
    ({"hostname": "-oProxyCommand=x"}, "hostname: not a hostname"),
    ({"hostname": "a" * 65}, "hostname: not a hostname"),
    ({"iface": "ens5\nx"}, "iface: not an interface name"),
    ({"iface": "a" * 16}, "iface: not an interface name"),
    ({"slots": 0}, "slots: not a whole number from 1 to 4096"),
    ({"slots": "2"}, "slots: not a whole number from 1 to 4096"),
    ({"slots": True}, "slots: not a whole number from 1 to 4096"),
    ({"gpus": -1}, "gpus: not a whole number from 0 to 4096"),
    ({"extra": 1}, "not a node: expected an object of address, hostname, slots, iface, gpus"),
])
def test_a_bad_spare_line_names_the_field(fields, message):
    data = {"address": "10.0.0.9", "hostname": "node-9", "slots": 2, "iface": "ens5", "gpus": 0, **fields}
    with pytest.raises(ValueError) as e:
        runplan.parse_spare_line(runplan.SPARE_LINE + json.dumps(data))
    assert str(e.value) == message


@pytest.mark.parametrize("line, message", [("spare {", "not JSON after the word"), ("spare [1]", "not a node: "),
                                           ("beat", "not a 'spare' line")])
def test_a_spare_line_that_is_not_one(line, message):
    with pytest.raises(ValueError, match=message):
        runplan.parse_spare_line(line)


def test_merge_takes_a_new_node_after_the_spares_and_refuses_one_the_run_has_or_had():
    spares, refused = runplan.merge_spares([N1, N2], [N3], {"node-7": "lost"}, [N4])
    assert spares == (N3, N4) and refused == {}
    again = PlanNode("10.0.0.5", "node-2", 2, "ens5")  # a hostname the run has
    same_address = PlanNode("10.0.0.3", "node-8", 2, "ens5")  # a spare's address under another name
    out = PlanNode("10.0.0.7", "node-7", 2, "ens5")  # quarantined: never used again
    spares, refused = runplan.merge_spares([N1, N2], [N3], {"node-7": "lost"}, [again, same_address, out, N4, N4])
    assert spares == (N3, N4)
    assert refused == {"node-2": "a node of this job has that hostname",
                       "node-8": "a node of this job has its address 10.0.0.3",
                       "node-7": "taken out of this job before", "node-4": "a node of this job has that hostname"}


def test_new_nodes_are_those_the_job_has_not_seen_once_each():
    from dtrain.launch.jobs.joining import new_nodes
    from dtrain.launch.remote.hosts import Node

    found = [Node("10.0.0.1"), Node("10.0.0.4"), Node("10.0.0.4"), Node("10.0.0.5")]
    assert new_nodes(found, {"10.0.0.1", "10.0.0.2"}) == [Node("10.0.0.4"), Node("10.0.0.5")]


def test_follow_joins_each_new_node_says_why_one_cannot_and_a_provider_failure_once():
    """The provider fails twice for one reason (said once), then names two new nodes: one joins
    and is offered; the other's join fails (said, the job goes on); the next asks offer none again."""
    import threading

    from dtrain.launch.errors import LaunchError
    from dtrain.launch.jobs.joining import follow
    from dtrain.launch.remote.hosts import Node

    answers = [RuntimeError("no route\nto AWS"), RuntimeError("no route to AWS"),
               [Node("10.0.0.1"), Node("10.0.0.4"), Node("10.0.0.5")], [Node("10.0.0.4"), Node("10.0.0.5")]]
    stop = threading.Event()

    def source():
        a = answers.pop(0)
        if not answers:
            stop.set()
        if isinstance(a, Exception):
            raise a
        return a

    def join(n):
        if n.host == "10.0.0.5":
            raise LaunchError("it holds image sha256:aaa for the job's sha256:bbb")
        return PlanNode(n.host, "node-4", 2, "ens5")

    said, offered = [], []
    known = {"10.0.0.1"}
    follow(source, known, join, offered.append, said.append, stop, every=0.01)
    assert offered == [PlanNode("10.0.0.4", "node-4", 2, "ens5")]
    assert said == ["[launch] warning: new nodes for spares not asked (no route to AWS); asked again in 0.01 s",
                    "[launch] 10.0.0.4 came to the cluster: making it a spare of this job",
                    "[launch] 10.0.0.5 came to the cluster: making it a spare of this job",
                    "[launch] warning: 10.0.0.5 is not a spare of this job: it holds image sha256:aaa for the job's "
                    "sha256:bbb"]
    assert known == {"10.0.0.1", "10.0.0.4", "10.0.0.5"}


def test_a_join_that_breaks_is_one_line_and_one_ended_by_the_jobs_end_says_nothing():
    import threading

    from dtrain.launch.jobs.joining import follow
    from dtrain.launch.remote.hosts import Node

    stop = threading.Event()
    said, offered = [], []

    def join(n):
        if n.host == "10.0.0.7":
            stop.set()  # the job ended meanwhile: its teardown broke this join
        raise RuntimeError("cannot schedule new futures\nafter shutdown")

    follow(lambda: [Node("10.0.0.6"), Node("10.0.0.7"), Node("10.0.0.8")], set(), join, offered.append, said.append,
           stop, every=0.01)
    assert offered == [] and said == [
        "[launch] 10.0.0.6 came to the cluster: making it a spare of this job",
        "[launch] warning: 10.0.0.6 is not a spare of this job: RuntimeError: cannot schedule new futures after shutdown",
        "[launch] 10.0.0.7 came to the cluster: making it a spare of this job"]


def test_a_node_still_starting_is_tried_again_and_a_known_address_named_again_is_a_new_node():
    """node .4 is still booting at two polls (one line, then quiet), joins at the third. node .2,
    a node of the job, leaves the group and comes back at its address (a replacement given the
    Elastic IP the old one left): a new node, made a spare too."""
    import threading

    from dtrain.launch.jobs.joining import NotYet, follow
    from dtrain.launch.remote.hosts import Node

    polls = [["1", "2", "4"], ["1", "2", "4"], ["1", "2", "4"], ["1", "4"], ["1", "2", "4"], ["1", "2", "4"]]
    stop = threading.Event()
    booting = {"10.0.0.4": 2}

    def source():
        hosts = polls.pop(0)
        if not polls:
            stop.set()
        return [Node(f"10.0.0.{h}") for h in hosts]

    def join(n):
        if booting.get(n.host):
            booting[n.host] -= 1
            raise NotYet("its first boot (cloud-init) is still running")
        return PlanNode(n.host, "h" + n.host[-1], 1, "ens5")

    said, offered = [], []
    follow(source, {"10.0.0.1", "10.0.0.2"}, join, offered.append, said.append, stop, every=0.01)
    assert [p.address for p in offered] == ["10.0.0.4", "10.0.0.2"]
    assert said == ["[launch] 10.0.0.4 came to the cluster: making it a spare of this job",
                    "[launch] 10.0.0.4: its first boot (cloud-init) is still running; tried again every 0.01 s",
                    "[launch] 10.0.0.2 came to the cluster: making it a spare of this job"]


def test_a_node_that_never_gets_ready_is_given_up_in_one_line():
    import threading

    from dtrain.launch.jobs import joining
    from dtrain.launch.remote.hosts import Node

    stop = threading.Event()
    calls, polls = [], []

    def source():
        polls.append(1)
        if len(polls) >= joining.TRIES + 3:  # 3 polls more than it is tried at
            stop.set()
        return [Node("10.0.0.9")]

    def join(n):
        calls.append(n)
        raise joining.NotYet("ssh does not reach it yet (connection refused)")

    said = []
    joining.follow(source, set(), join, lambda p: None, said.append, stop, every=0.001)
    assert len(calls) == joining.TRIES
    assert said[-1] == (f"[launch] warning: 10.0.0.9 is not a spare of this job: ssh does not reach it yet "
                        f"(connection refused) after {joining.TRIES} tries") and len(said) == 3


def test_an_address_with_a_scope_or_a_second_line_is_not_one():
    for address in ("fe80::1%x\n10.9.9.9 ip-evil", "fe80::1%eth0", "10.0.0.1 ", " 10.0.0.1"):
        data = {"address": address, "hostname": "node-9", "slots": 2, "iface": "ens5"}
        with pytest.raises(ValueError, match="^address: not an IP address$"):
            runplan.plan_node(data)
    assert runplan.plan_node({"address": "fd00::9", "hostname": "node-9", "slots": 2, "iface": "ens5"}).address == "fd00::9"


def _facts(host, hostname, iface="ens5", gpus=8, slots=8):
    from dtrain.launch.jobs.spec import NodeFacts
    from dtrain.launch.remote.hosts import Node

    return NodeFacts(Node(host, slots), host, hostname, iface, gpus, (), "")


@pytest.mark.parametrize("fact, subnet, message", [
    (_facts("10.0.1.14", "ip-14"), None, ""),
    (_facts("10.0.1.14", "ip-11"), None, "its hostname ip-11 is a node's of the job"),
    (_facts("10.0.1.14", "ip-14", gpus=4), None, "it has 4 GPU(s), the job's nodes [8]"),
    (_facts("10.0.1.14", "ip-14", slots=1), None, "it has 1 slot(s), the job's nodes [8]"),
    (_facts("10.0.1.14", "ip-14", iface="eth0"), None, "its NIC is eth0, the job's nodes' ens5"),
    (_facts("10.0.1.14", "ip-14", iface="eth0"), "10.0.1.0/24", ""),  # NIC names differ: the subnet decides
    (_facts("10.0.2.14", "ip-14"), "10.0.1.0/24", "its address 10.0.2.14 is outside the job's subnet 10.0.1.0/24"),
])
def test_join_problem(fact, subnet, message):
    from dtrain.launch.jobs.job import join_problem
    from dtrain.launch.jobs.spec import Started

    started = Started([_facts("10.0.1.11", "ip-11"), _facts("10.0.1.12", "ip-12")], "sha256:aa", 4, subnet)
    assert join_problem(fact, "sha256:aa", started) == message
    assert join_problem(fact, "sha256:bb", started).startswith("it holds image sha256:bb for the job's sha256:aa")


@pytest.mark.parametrize("cloud_init, docker, want", [
    ("status: running", 0, "booting"), ("status: not started", 0, "booting"), ("status: done", 1, "no-docker"),
    ("status: done", 0, "ready"), (None, 0, "ready"), (None, 1, "no-docker"), ("status: error", 0, "ready")])
def test_booted_says_whether_a_node_that_came_has_finished_starting(tmp_path, cloud_init, docker, want):
    """launch/node/host/booted.sh, the node step a join asks first, with stand-ins for cloud-init
    (the instance's first boot) and docker on PATH; a node without cloud-init asks docker alone."""
    import os
    import subprocess

    from dtrain.launch.jobs import node_programs

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if cloud_init is not None:
        (bin_dir / "cloud-init").write_text(f"#!/bin/sh\necho '{cloud_init}'\n")
    (bin_dir / "docker").write_text(f"#!/bin/sh\nexit {docker}\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    r = subprocess.run(node_programs.host_argv("booted"), capture_output=True, text=True, timeout=30,
                       env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert (r.returncode, r.stdout) == (0, want + "\n"), r.stderr

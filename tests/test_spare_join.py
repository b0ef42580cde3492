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

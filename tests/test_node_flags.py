"""The flags that name and reach the nodes are the launch model's (issue 48): each says in
jobfile.py which node provider it chooses (`nodes: ssh|ec2`) or that every provider's nodes take
it (`nodes: any`); the providers, the errors, NODE_HELP and every task that works on nodes derive
them from there. A new node flag touches the model and its provider, nothing else."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import tasks
from dtrain.launch import targets
from dtrain.launch.jobs import jobfile

ROOT = Path(__file__).resolve().parent.parent
NODE_TASKS = ("pull", "doctor", "bench_network")  # the tasks that work on the nodes the launch would


def test_the_providers_flags_are_the_models():
    for p in targets.PROVIDERS.values():
        assert p.flags == jobfile.selecting(p.name), p.name
    chosen = {f for p in targets.PROVIDERS.values() for f in p.flags}
    assert chosen == {k for k in jobfile.node_fields() if jobfile._extra(k)["nodes"] != "any"}
    assert {f.name for f in dataclasses.fields(targets.NodeArgs)} <= set(jobfile.node_fields())
    assert [k for k, _ in targets._NAMED_BY] == [k for k in jobfile.node_fields() if k in chosen - {"cluster"}]


def test_every_task_on_nodes_takes_every_node_flag_with_the_models_help():
    assert tuple(tasks.NODE_HELP) == jobfile.node_fields()
    for name in NODE_TASKS:
        body = getattr(tasks, name).body
        params = inspect.signature(body).parameters
        assert set(jobfile.node_fields()) <= set(params), name
        assert all(params[k].default is None for k in jobfile.node_fields()), name


def test_no_node_flag_is_listed_by_hand_outside_the_model():
    """Two node flags of different providers side by side in a literal (a hand-made list of them):
    only in jobfile.py, where each is declared."""
    pair = re.compile(r"[\"'](hostfile|hosts)[\"'][^\n]*[\"'](ec2_tag|cluster)[\"']|[\"'](ec2_tag|cluster)[\"'][^\n]*[\"'](hostfile|hosts)[\"']")
    found = [f"{p.relative_to(ROOT)}:{i}" for d in ("launch", "dtrain") for p in (ROOT / d).rglob("*.py")
             if p.name != "jobfile.py" for i, line in enumerate(p.read_text().splitlines(), 1)
             if pair.search(line) and not line.lstrip().startswith("#")]
    assert found == [], found
    assert pair.search('NODE_HELP = {k: LAUNCH_HELP[k] for k in ("cluster", "hostfile", "hosts", "ec2_tag")}')

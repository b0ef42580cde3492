"""The flight recorder's dumps read (launch/jobs/flightrec.py): which rank did not enter the
collective the others wait in. The dumps are real (tests/data/flight_recorder/README.md: torch
2.13.0+cpu, gloo, two processes on 127.0.0.1, rank 1 skipping an all_reduce)."""

from __future__ import annotations

import pickle
from pathlib import Path

from dtrain.launch.jobs import flightrec

DATA = Path(__file__).resolve().parent / "data" / "flight_recorder"


def _dumps(ext: str) -> dict[int, dict]:
    return {r: flightrec.load((DATA / f"rank{r}.{ext}").read_bytes()) for r in (0, 1)}


def test_the_rank_that_skipped_a_collective_is_named_from_real_dumps():
    for ext in ("pickle", "json"):
        dumps = _dumps(ext)
        assert [flightrec.last_entered(d) for d in dumps.values()] == [{"0": 4}, {"0": 3}], ext
        (b,) = flightrec.behind(dumps)
        assert (b.pg, b.ranks, b.entered, b.seq, b.op, b.waiting) == ("0", (1,), (3,), 4, "gloo:all_reduce", (0,))
        assert flightrec.text([b], 2, 2, ["node-1", "node-2"]) == (
            "flight recorder: r1 (node-2) (entered up to #3) did not enter gloo:all_reduce #4 of process "
            "group 0 that r0 waits in")


def test_agreeing_dumps_name_nobody_and_no_dump_says_why():
    d = _dumps("pickle")
    assert flightrec.behind({0: d[1], 1: d[1]}) == []
    assert flightrec.text([], 2, 2) == "flight recorder: 2/2 ranks' dumps agree on the last collective"
    assert flightrec.text([], 0, 4) == f"flight recorder: {flightrec.NO_DUMP_GLOO}"
    # from the entries where pg_status is missing (an older dump)
    no_status = {k: v for k, v in d[0].items() if k != "pg_status"}
    assert flightrec.last_entered(no_status) == {"0": 4}


def test_a_dump_is_untrusted_no_class_is_unpickled():
    class Boom:
        def __reduce__(self):
            return (print, ("ran",))

    assert flightrec.load(pickle.dumps({"entries": [Boom()]})) is None
    assert flightrec.load(b"") is None and flightrec.load(b"not a dump") is None
    assert flightrec.load(b"[1, 2]") is None and flightrec.load(b"\x80\x04K\x01.") is None  # not a dict


def test_torchrun_ranks_record_and_dump_into_the_job_dir():
    env = dict(flightrec.env("/dtrain-job"))
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == str(flightrec.BUFFER)
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "/dtrain-job/fr/rank_" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"

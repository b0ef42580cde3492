"""`dtrain sagemaker run` as simple-sagemaker users expect it (issue 40, seed 003): task state (a
task Completed with the same run is skipped and its output reused; --force; InProgress followed),
--input-task chaining, --dependencies on PYTHONPATH, --tag, and the role made by --create-role.
AWS is moto (in-process, or a moto server on loopback for the CLI)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from dtrain.launch.errors import LaunchError
from dtrain.launch.sagemaker import engine as sm
from test_sagemaker import ROLE, _ml, train

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/pytorch-ddp:2.13.0-cpu-py311-debian12"
BUCKET = "proj-bucket"


def _work(tmp_path: Path, name: str = "imagenet") -> Path:
    wd = tmp_path / name
    wd.mkdir()
    (wd / "main.py").write_text("print('train')\n")
    return wd


def _opts(work: Path, tmp_path: Path, **kw) -> sm.RunOptions:
    base = dict(image=IMAGE, role_arn=ROLE, command=("python", "main.py"), output_s3=f"s3://{BUCKET}/dtrain",
                workdir=work, download=None, spot=False, task_state=True)
    return sm.run_options(**{**base, **kw})


def _jobs(aws) -> list[str]:
    return sorted(j["TrainingJobName"] for j in aws.client("sagemaker").list_training_jobs()["TrainingJobSummaries"])


def _keys(aws, prefix: str = "") -> set[str]:
    r = aws.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"] for o in r.get("Contents", [])}


def _model(aws, job: str) -> str:
    """What SageMaker does at the end of a job: its model.tar.gz where DescribeTrainingJob says."""
    uri = aws.client("sagemaker").describe_training_job(TrainingJobName=job)["ModelArtifacts"]["S3ModelArtifacts"]
    bucket, key = sm.check_s3_uri(uri, "x")
    aws.client("s3").put_object(Bucket=bucket, Key=key, Body=f"model of {job}".encode())
    return uri


@pytest.fixture
def bucket(aws):
    aws.client("s3").create_bucket(Bucket=BUCKET)
    return aws


# ---------------------------------------------------------------- task state


def test_a_completed_task_is_skipped_its_output_reused_and_force_runs_it_again(bucket, tmp_path):
    aws, work = bucket, _work(tmp_path)
    first, code = sm.run(_opts(work, tmp_path, task="prep"), session=aws, out=lambda _: None, poll_s=0)
    assert code == 0 and re.fullmatch(r"prep-\d{8}-\d{6}-[0-9a-f]{4}", first)
    _model(aws, first)
    printed: list[str] = []
    again = sm.run(_opts(work, tmp_path, task="prep", download=tmp_path / "again"), session=aws, out=printed.append,
                   poll_s=0)
    assert again == (first, 0) and _jobs(aws) == [first]  # no second job
    assert printed[0] == (f"[sagemaker] task prep: completed already by job {first} with this code and these "
                          "settings; skipped (--force runs it again)")
    assert f"[sagemaker] output s3://{BUCKET}/dtrain/{first}/output/" in printed
    assert (tmp_path / "again" / first / "model.tar.gz").read_bytes() == f"model of {first}".encode()

    printed.clear()
    forced, code = sm.run(_opts(work, tmp_path, task="prep", force=True), session=aws, out=printed.append, poll_s=0)
    assert code == 0 and forced != first and _jobs(aws) == sorted([first, forced])
    assert f"[sagemaker] task prep: job {first} Completed it; running it again (--force)" in printed
    # Other code is another run of the task: it runs without --force.
    (work / "main.py").write_text("print('train v2')\n")
    printed.clear()
    changed, _ = sm.run(_opts(work, tmp_path, task="prep"), session=aws, out=printed.append, poll_s=0)
    assert changed not in (first, forced) and len(_jobs(aws)) == 3
    assert f"[sagemaker] task prep: job {forced} Completed it; running it again (the code or settings changed)" \
        in printed


def test_tasks_are_per_project_and_failed_ones_run_again(bucket, tmp_path):
    aws, work = bucket, _work(tmp_path)
    a, _ = sm.run(_opts(work, tmp_path, task="t", project="alpha"), session=aws, out=lambda _: None, poll_s=0)
    b, _ = sm.run(_opts(work, tmp_path, task="t", project="beta"), session=aws, out=lambda _: None, poll_s=0)
    assert a != b and len(_jobs(aws)) == 2
    failed = _Scripted(aws, {"search": "Failed"})
    c, _ = sm.run(_opts(work, tmp_path, task="t", project="alpha"), session=failed, out=lambda _: None, poll_s=0)
    assert c not in (a, b) and len(_jobs(aws)) == 3


def test_without_task_state_every_run_is_a_new_job(bucket, tmp_path):
    """launch --target sagemaker (no --force there): the same naming and tags, no skipping."""
    aws, work = bucket, _work(tmp_path)
    one, _ = sm.run(_opts(work, tmp_path, task="t", task_state=False), session=aws, out=lambda _: None, poll_s=0)
    two, _ = sm.run(_opts(work, tmp_path, task="t", task_state=False), session=aws, out=lambda _: None, poll_s=0)
    assert one != two and _jobs(aws) == sorted([one, two]) and one.startswith("t-")


class _Scripted:
    """moto's training jobs are Completed at once. This session hands out moto's clients; the
    sagemaker one shows the jobs Search finds with the status given (InProgress, Failed...), and
    DescribeTrainingJob the next of `describe` statuses; `fail_create` makes CreateTrainingJob
    refuse, as SageMaker does for a role it cannot assume."""

    def __init__(self, session, statuses: dict, fail_create: str | None = None):
        self.session, self.statuses, self.fail_create = session, statuses, fail_create

    def client(self, name):
        real = self.session.client(name)
        if name != "sagemaker":
            return real
        outer = self

        class Client:
            def __getattr__(self, attr):
                return getattr(real, attr)

            def search(self, **kw):
                r = real.search(**kw)
                status = outer.statuses.get("search")
                if status:
                    for x in r["Results"]:
                        x["TrainingJob"]["TrainingJobStatus"] = status
                return r

            def describe_training_job(self, **kw):
                d = real.describe_training_job(**kw)
                steps = outer.statuses.get("describe") or []
                return {**d, "TrainingJobStatus": steps.pop(0)} if steps else d

            def create_training_job(self, **kw):
                if outer.fail_create:
                    raise ClientError({"Error": {"Code": "ValidationException", "Message": outer.fail_create}},
                                      "CreateTrainingJob")
                return real.create_training_job(**kw)
        return Client()


def test_a_task_in_progress_is_followed_not_started_again(bucket, tmp_path):
    aws, work = bucket, _work(tmp_path)
    first, _ = sm.run(_opts(work, tmp_path, task="long"), session=aws, out=lambda _: None, poll_s=0)
    _model(aws, first)
    running = _Scripted(aws, {"search": "InProgress", "describe": ["InProgress", "InProgress"]})
    printed: list[str] = []
    assert sm.run(_opts(work, tmp_path, task="long", download=tmp_path / "out"), session=running,
                  out=printed.append, poll_s=0) == (first, 0)
    assert _jobs(aws) == [first]
    assert printed[0] == (f"[sagemaker] task long: job {first} is running it (InProgress); following it instead "
                          "of starting another")
    assert f"[sagemaker] {first}: Completed (Completed)" in printed  # waited until it ended
    assert (tmp_path / "out" / first / "model.tar.gz").is_file()
    with pytest.raises(LaunchError, match=rf"^--task long: job {first} of the task is InProgress and --force; "):
        sm.run(_opts(work, tmp_path, task="long", force=True), session=_Scripted(aws, {"search": "InProgress"}),
               out=lambda _: None, poll_s=0)
    (work / "main.py").write_text("other\n")
    with pytest.raises(LaunchError, match="this run's code or settings differ from it"):
        sm.run(_opts(work, tmp_path, task="long"), session=_Scripted(aws, {"search": "InProgress"}),
               out=lambda _: None, poll_s=0)
    with pytest.raises(LaunchError, match=rf"^--task long: job {first} of the task is Stopping; run again once"):
        sm.run(_opts(work, tmp_path, task="long"), session=_Scripted(aws, {"search": "Stopping"}),
               out=lambda _: None, poll_s=0)
    assert _jobs(aws) == [first]


def test_task_action_table():
    last = lambda status, digest="d": {"TrainingJobStatus": status, "TrainingJobName": "j",  # noqa: E731
                                       "Tags": {sm.DIGEST_TAG: digest, sm.TASK_TAG: "t"}}
    assert sm.task_action(None, "d", False) == "run"
    assert sm.task_action(last("Completed"), "d", False) == "skip"
    assert sm.task_action(last("Completed"), "d", True) == "run"
    assert sm.task_action(last("Completed", "other"), "d", False) == "run"
    assert sm.task_action(last("InProgress"), "d", False) == "attach"
    assert sm.task_action(last("Failed"), "d", False) == "run"
    assert sm.task_action(last("Stopped"), "d", False) == "run"


def test_run_digest_follows_code_settings_and_data_names(tmp_path):
    (tmp_path / "a.py").write_text("1")
    trees = {"code": (tmp_path, [Path("a.py")])}
    one = sm.run_digest({"command": ["x"]}, trees, {})
    assert one == sm.run_digest({"command": ["x"]}, trees, {})
    assert one != sm.run_digest({"command": ["y"]}, trees, {})
    (tmp_path / "a.py").write_text("2")
    assert one != sm.run_digest({"command": ["x"]}, trees, {})


# ---------------------------------------------------------------- --input-task


def test_input_task_chains_the_last_completed_job_of_the_task(bucket, tmp_path):
    aws, work = bucket, _work(tmp_path)
    prep, _ = sm.run(_opts(work, tmp_path, task="prep"), session=aws, out=lambda _: None, poll_s=0)
    printed: list[str] = []
    train_job, code = sm.run(_opts(work, tmp_path, task="train", input_tasks={"data": "prep", "prep": "prep"}),
                             session=aws, out=printed.append, poll_s=0)
    assert code == 0
    d = aws.client("sagemaker").describe_training_job(TrainingJobName=train_job)
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in d["InputDataConfig"]}
    assert channels["data"] == channels["prep"] == f"s3://{BUCKET}/dtrain/{prep}/output/"
    assert any(line.endswith("channel data <- task prep, channel prep <- task prep)") for line in printed)
    # A new run of prep is a new input: train runs again (its digest names prep's job).
    sm.run(_opts(work, tmp_path, task="prep", force=True), session=aws, out=lambda _: None, poll_s=0)
    again, _ = sm.run(_opts(work, tmp_path, task="train", input_tasks={"data": "prep"}), session=aws,
                      out=lambda _: None, poll_s=0)
    assert again != train_job


def test_input_task_errors_before_anything_is_uploaded(bucket, tmp_path):
    aws, work = bucket, _work(tmp_path)
    with pytest.raises(LaunchError) as e:
        sm.run(_opts(work, tmp_path, task="train", input_tasks={"data": "nosuch"}), session=aws, out=lambda _: None)
    assert str(e.value) == ("--input-task data=nosuch: no task nosuch in project dtrain (run it first: dtrain "
                            "sagemaker run --task nosuch ...)")
    prep, _ = sm.run(_opts(work, tmp_path, task="prep"), session=aws, out=lambda _: None, poll_s=0)
    before = _keys(aws)
    with pytest.raises(LaunchError, match=rf"^--input-task data=prep: its last job {prep} is Failed; chain from a "
                                          "Completed task$"):
        sm.run(_opts(work, tmp_path, task="train", input_tasks={"data": "prep"}),
               session=_Scripted(aws, {"search": "Failed"}), out=lambda _: None)
    assert _keys(aws) == before and _jobs(aws) == [prep]
    with pytest.raises(LaunchError, match="channel 'code' is taken"):
        sm.parse_input_tasks(["code=prep"], {})
    with pytest.raises(LaunchError, match="channel 'data' is taken"):
        sm.parse_input_tasks(["data=prep"], {"data": "s3://b/x"})
    assert sm.parse_input_tasks(["prep", "m=pretrain"], {}) == {"prep": "prep", "m": "pretrain"}


# ---------------------------------------------------------------- --dependencies


def test_dependencies_go_to_their_channel_by_the_workdir_rules_and_on_pythonpath(bucket, tmp_path):
    aws, work = bucket, _work(tmp_path)
    lib = tmp_path / "shared" / "mylib"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("VALUE = 42\n")
    (lib / ".env").write_text("TOKEN=secret\n")  # left out, as from the code
    (lib / "id_rsa").write_text("key\n")
    deps = sm.parse_dependencies([str(lib)])
    printed: list[str] = []
    job, _ = sm.run(_opts(work, tmp_path, task="deps", dependencies=deps), session=aws, out=printed.append, poll_s=0)
    assert _keys(aws, f"dtrain/{job}/deps/") == {f"dtrain/{job}/deps/mylib/__init__.py"}
    assert "[sagemaker] mylib: left out 2 that may hold secrets: .env, id_rsa (to send one, add !NAME to " \
           ".dtrainignore)" in printed
    d = aws.client("sagemaker").describe_training_job(TrainingJobName=job)
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in d["InputDataConfig"]}
    assert channels["deps"] == f"s3://{BUCKET}/dtrain/{job}/deps/"
    assert d["HyperParameters"]["dtrain_pythonpath"] == "deps"
    with pytest.raises(LaunchError, match="--dependencies nothere: not a directory"):
        sm.parse_dependencies(["nothere"], base=tmp_path)
    (tmp_path / "other" / "mylib").mkdir(parents=True)
    with pytest.raises(LaunchError, match="a dependency named mylib is given already"):
        sm.parse_dependencies([str(lib), str(tmp_path / "other" / "mylib")])


def test_the_container_puts_the_dependencies_channel_first_on_pythonpath(tmp_path):
    hps = sm.hyperparameters(["python", "main.py"], "torchrun", 1, pythonpath="deps")
    ml = _ml(tmp_path / "ml", "algo-1", hosts=("algo-1",), hps=hps, channels=("code", "deps"))
    (ml / "input/data/deps/mylib").mkdir()
    (ml / "input/data/deps/mylib/__init__.py").write_text("VALUE = 42\n")
    c = train.read_contract(ml)
    job = train.job_args(c.hyperparameters, gpus=0)
    site = tmp_path / "site"
    assert train.job_pythonpath(c, job, site) == [str(ml / "input/data/deps"), str(site)]
    env = train.with_pythonpath({**os.environ, "PYTHONPATH": "/elsewhere"},
                                ":".join(train.job_pythonpath(c, job, None)))
    assert env["PYTHONPATH"] == f"{ml}/input/data/deps:/elsewhere"
    r = subprocess.run([sys.executable, "-c", "import mylib; print(mylib.VALUE)"], env=env, capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.stdout.strip() == "42", r.stderr
    assert train.job_pythonpath(c, train.job_args(sm.hyperparameters(["x"], "torchrun", 1), 0), None) == []
    # The channel missing: the job ends before the command, the reason in SageMaker's failure file.
    bad = _ml(tmp_path / "bad", "algo-1", hosts=("algo-1",), hps=hps, channels=("code",))
    assert train.main(bad) == 2
    assert "hyperparameter dtrain_pythonpath: no channel 'deps'" in (bad / "output/failure").read_text()


# ---------------------------------------------------------------- --tag


def test_tags_on_the_job_besides_dtrains_own(bucket, tmp_path):
    aws, work = bucket, _work(tmp_path)
    tags = sm.parse_tags(["team=vision", "cost-center=ml:42", "note=a b"])
    job, _ = sm.run(_opts(work, tmp_path, task="tagged", project="imagenet", tags=tags), session=aws,
                    out=lambda _: None, poll_s=0)
    client = aws.client("sagemaker")
    arn = client.describe_training_job(TrainingJobName=job)["TrainingJobArn"]
    got = {t["Key"]: t["Value"] for t in client.list_tags(ResourceArn=arn)["Tags"]}
    assert {k: got[k] for k in tags} == tags
    assert got[sm.TASK_TAG] == "tagged" and got[sm.PROJECT_TAG] == "imagenet" and len(got[sm.DIGEST_TAG]) == 16


@pytest.mark.parametrize("item, message", [
    ("team", "--tag team: expected KEY=VALUE"),
    ("=x", "--tag =x: expected KEY=VALUE"),
    ("a=b;c", "--tag a=b;c: expected KEY=VALUE"),
    ("aws:x=1", "the key 'aws:x' is reserved"),
    ("dtrain:task=1", "the key 'dtrain:task' is reserved"),
])
def test_tag_refusals(item, message):
    with pytest.raises(LaunchError, match=re.escape(message)):
        sm.parse_tags([item])
    with pytest.raises(LaunchError, match="--tag a: given twice"):
        sm.parse_tags(["a=1", "a=2"])


# ---------------------------------------------------------------- the role


def test_create_role_makes_a_least_privilege_role_once_and_widens_it(bucket, tmp_path):
    aws, work = bucket, _work(tmp_path)
    iam = aws.client("iam")
    with pytest.raises(LaunchError) as e:
        sm.run(_opts(work, tmp_path, task="r", role_arn=""), session=aws, out=lambda _: None)
    assert str(e.value) == ("--role: none given, and this account has no role dtrain-sagemaker: pass --role ARN (a "
                            "SageMaker execution role), or --create-role to make dtrain-sagemaker once")
    assert _keys(aws) == set() and _jobs(aws) == [] and iam.list_roles()["Roles"] == []

    printed: list[str] = []
    job, _ = sm.run(_opts(work, tmp_path, task="r", role_arn="", create_role=True), session=aws, out=printed.append,
                    poll_s=0)
    role = iam.get_role(RoleName=sm.ROLE_NAME)["Role"]
    assert aws.client("sagemaker").describe_training_job(TrainingJobName=job)["RoleArn"] == role["Arn"]
    trust = role["AssumeRolePolicyDocument"]
    trust = json.loads(trust) if isinstance(trust, str) else trust
    assert trust["Statement"][0]["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    assert iam.list_attached_role_policies(RoleName=sm.ROLE_NAME)["AttachedPolicies"] == []  # no broad managed policy
    assert sm.role_buckets(iam) == {BUCKET}
    assert any(line.startswith(f"[sagemaker] created IAM role dtrain-sagemaker ({role['Arn']})") for line in printed)

    # Reused without the flag; another bucket is added to its policy.
    aws.client("s3").create_bucket(Bucket="other-bucket")
    aws.client("s3").create_bucket(Bucket="data-bucket")
    printed.clear()
    sm.run(_opts(work, tmp_path, task="r2", role_arn="", output_s3="s3://other-bucket/x",
                 inputs={"data": "s3://data-bucket/imagenet"}), session=aws, out=printed.append, poll_s=0)
    assert len(iam.list_roles()["Roles"]) == 1 and sm.role_buckets(iam) == {BUCKET, "other-bucket", "data-bucket"}
    assert "[sagemaker] IAM role dtrain-sagemaker: S3 access widened to data-bucket, other-bucket" in printed


def test_a_missing_bucket_is_refused_before_the_role_or_any_upload(bucket, tmp_path):
    """--create-role --output s3://missing/...: one line naming the flag and the bucket, and
    nothing made (no role, no upload, no job); the same for --state-dir and an --input bucket
    that does not exist (issue 47: the role was made, then the cleanup's NoSuchBucket shown)."""
    aws, work = bucket, _work(tmp_path)
    for kw, message in [
        ({"output_s3": "s3://missing-bucket/runs"}, "--output: no bucket missing-bucket; make it "
                                                    "(`aws s3 mb s3://missing-bucket`) or name another"),
        ({"state_s3": "s3://missing-state/s"}, "--state-dir: no bucket missing-state; make it"),
        ({"inputs": {"data": "s3://missing-data/x"}}, "--input data: no bucket missing-data; make it"),
    ]:
        with pytest.raises(LaunchError) as e:
            sm.run(_opts(work, tmp_path, task="m", role_arn="", create_role=True, **kw), session=aws,
                   out=lambda _: None, poll_s=0)
        assert str(e.value).startswith(message), str(e.value)
        assert aws.client("iam").list_roles()["Roles"] == [] and _keys(aws) == set() and _jobs(aws) == []


def test_bucket_problem_table():
    assert sm.bucket_problem("--output", "b", {"Code": "403"}, writes=True).startswith(
        "--output: bucket b refuses these credentials (HeadBucket: 403)")
    assert sm.bucket_problem("--input d", "b", {"Code": "403"}, writes=False) is None  # the job's role may read it
    assert sm.bucket_problem("--input d", "b", {"Code": "404"}, writes=False).startswith("--input d: no bucket b")


# ---------------------------------------------------------------- nothing half-made


def test_a_refused_create_leaves_no_upload_behind(bucket, tmp_path):
    aws, work = bucket, _work(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.csv").write_text("1\n")
    lib = tmp_path / "mylib"
    lib.mkdir()
    (lib / "__init__.py").write_text("")
    refused = _Scripted(aws, {}, fail_create="Could not assume role arn:aws:iam::123456789012:role/x.\n Check it.")
    with pytest.raises(LaunchError) as e:
        sm.run(_opts(work, tmp_path, task="half", name="half-1", inputs={"data": str(data)},
                     dependencies={"mylib": lib}), session=refused, out=lambda _: None, poll_s=0)
    assert str(e.value) == ("CreateTrainingJob half-1: ValidationException: Could not assume role "
                            "arn:aws:iam::123456789012:role/x. Check it.")
    assert _keys(aws) == set() and _jobs(aws) == []


def test_ctrl_c_during_the_upload_removes_what_was_uploaded(bucket, tmp_path):
    aws, work = bucket, _work(tmp_path)
    for i in range(3):
        (work / f"m{i}.py").write_text("x\n")

    def out(line):
        if "uploading" in line and "deps" not in line:
            raise KeyboardInterrupt
    lib = tmp_path / "mylib"
    lib.mkdir()
    (lib / "__init__.py").write_text("")

    class Interrupting:  # Ctrl-C in the middle of the uploads (after the code, during the dependency)
        def __init__(self, session):
            self.session = session

        def client(self, name):
            real = self.session.client(name)
            if name != "s3":
                return real

            class S3:
                def __getattr__(self, attr):
                    return getattr(real, attr)

                def upload_file(self, path, bucket, key):
                    if "/deps/" in key:
                        raise KeyboardInterrupt
                    return real.upload_file(path, bucket, key)
            return S3()
    with pytest.raises(KeyboardInterrupt):
        sm.run(_opts(work, tmp_path, task="cc", dependencies={"mylib": lib}), session=Interrupting(aws),
               out=lambda _: None, poll_s=0)
    assert _keys(aws) == set() and _jobs(aws) == []


# ---------------------------------------------------------------- the CLI, one line per error


@pytest.mark.parametrize("flags, message", [
    (["--tag", "team"], "error: --tag team: expected KEY=VALUE"),
    (["--input-task", "a/b"], "error: --input-task a/b: expected [CHANNEL=]TASK"),
    (["--input-task", "code=prep"], "error: --input-task 'code=prep': channel 'code' is taken"),
    (["--dependencies", "nothere"], "error: --dependencies 'nothere': "),
    (["--project", "a b"], "error: --project a b: use letters, digits"),
    (["--local", "--instances", "2"], "error: --instances 2: --local runs one instance"),
])
def test_flag_errors_are_one_line(tmp_path, flags, message):
    r = subprocess.run([sys.executable, "-m", "dtrain", "sagemaker", "run", "--image", IMAGE, "--role", ROLE, *flags,
                        "--", "python", "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(message), r.stderr


# ---------------------------------------------------------------- the documented commands


def documented_task_commands() -> list[list[str]]:
    """The `dtrain sagemaker run` lines of docs/other-tools.md's task block (argv after `dtrain`)."""
    text = (ROOT / "docs" / "other-tools.md").read_text()
    block = text.split("<!-- run by tests/test_sagemaker_tasks.py::test_documented_tasks -->\n```sh\n", 1)[1]
    block = block.split("```", 1)[0].replace("\\\n", " ")
    lines = [re.sub(r"\s#.*$", "", ln) for ln in block.splitlines() if ln.startswith("dtrain sagemaker run")]
    return [shlex.split(ln.replace("$ECR/dtrain/pytorch-ddp:TAG", IMAGE))[1:] for ln in lines]


def test_documented_tasks(tmp_path, moto_server):
    """docs/other-tools.md's task example, from a project directory, against a moto server: the
    role made once, prep run, train chained to it with a dependency and tags, then prep again
    skipped and train again skipped, --force running prep again."""
    project = tmp_path / "imagenet"
    (project / "../common/mylib").mkdir(parents=True)
    (project / "../common/mylib/__init__.py").write_text("")
    for f in ("download.py", "main.py"):
        (project / f).write_text("print(1)\n")
    env = {**os.environ, "AWS_ENDPOINT_URL": moto_server, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
           "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true", "PYTHONPATH": str(ROOT)}
    commands = documented_task_commands()
    assert len(commands) >= 3
    outputs = []
    for argv in commands:
        r = subprocess.run([sys.executable, "-m", "dtrain", *argv], cwd=project, capture_output=True, text=True,
                           timeout=120, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        outputs.append(r.stdout)
    client = boto3.client("sagemaker", endpoint_url=moto_server, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    names = [j["TrainingJobName"] for j in client.list_training_jobs(MaxResults=100)["TrainingJobSummaries"]]
    prep = [n for n in names if n.startswith("prep-")]
    train_jobs = [n for n in names if n.startswith("train-")]
    assert len(train_jobs) == 1 and len(prep) == 1 + sum("--force" in argv for argv in commands)
    d = client.describe_training_job(TrainingJobName=train_jobs[0])
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in d["InputDataConfig"]}
    assert channels["imagenet"].endswith(f"/{min(prep)}/output/") and "deps" in channels
    tags = {t["Key"]: t["Value"] for t in client.list_tags(ResourceArn=d["TrainingJobArn"])["Tags"]}
    assert tags["team"] == "vision" and tags[sm.PROJECT_TAG] == "imagenet" and tags[sm.TASK_TAG] == "train"
    assert d["RoleArn"].endswith(f":role/{sm.ROLE_NAME}")
    assert sum("skipped (--force runs it again)" in o for o in outputs) >= 2


# ---------------------------------------------------------------- --local (the container's part: the lead's engine)


TRAIN_PY = """import json, os, pathlib
data = pathlib.Path(os.environ["SM_CHANNEL_TRAIN"])
total = sum(int(p.read_text()) for p in sorted(data.rglob("*.txt")))
import mylib
out = pathlib.Path(os.environ["SM_MODEL_DIR"]) / "model.json"
out.write_text(json.dumps({"total": total, "lib": mylib.VALUE, "hosts": json.loads(os.environ["SM_HOSTS"])}))
"""


def _as_the_container(argv, env):
    """What `IMAGE train` does with the mounted tree, minus the launcher: SageMaker's contract
    read by sagemaker_train (channels, SM_*, PYTHONPATH), the command run in the code channel.
    The tree is the host directory of argv's `-v ML:/opt/ml`."""
    ml = Path(argv[argv.index("-v") + 1].split(":", 1)[0])
    c = train.read_contract(ml)
    job = train.job_args(c.hyperparameters, gpus=0)
    run_env = train.with_pythonpath({**env, **train.sm_env(c, 0, ml)}, ":".join(train.job_pythonpath(c, job, None)))
    return subprocess.run(list(job.command), cwd=c.channels["code"], env=run_env).returncode


def _local_inputs(tmp_path: Path) -> tuple[Path, Path]:
    """A data channel of two files (1 and 2, one in a subdirectory) and a dependency `mylib`."""
    data = tmp_path / "data"
    (data / "a").mkdir(parents=True)
    (data / "1.txt").write_text("1")
    (data / "a/2.txt").write_text("2")
    lib = tmp_path / "libs" / "mylib"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("VALUE = 'lib'\n")
    return data, lib


def test_local_lays_out_opt_ml_as_sagemaker_and_keeps_the_model(tmp_path):
    work = _work(tmp_path)
    (work / "train.py").write_text(TRAIN_PY)
    (work / ".env").write_text("TOKEN=x\n")  # left out, as from an upload
    data, lib = _local_inputs(tmp_path)
    seen = []

    def runner(argv, env):
        seen.append(argv)
        return _as_the_container(argv, env)
    printed: list[str] = []
    opts = _opts(work, tmp_path, role_arn="", command=("python3", "train.py"), inputs={"train": str(data)},
                 dependencies={"mylib": lib}, env={"WANDB_API_KEY": "secret-value"}, download=tmp_path / "out",
                 task="local", name="local-1")
    assert sm.run_local(opts, out=printed.append, runner=runner) == ("local-1", 0)
    ml = tmp_path / "out/local-1/opt-ml"
    assert json.loads((ml / "model/model.json").read_text()) == {"total": 3, "lib": "lib", "hosts": ["algo-1"]}
    assert not (ml / "input/data/code/.env").exists() and (ml / "input/data/deps/mylib/__init__.py").is_file()
    [argv] = seen
    assert argv[:2] == ["docker", "run"] and argv[-2:] == [IMAGE, "train"]
    assert f"{ml}:/opt/ml" in argv and f"{tmp_path}/out/state/local:/opt/ml/checkpoints" in argv
    assert "WANDB_API_KEY" in argv and not any("secret-value" in a for a in argv)  # by name only
    assert printed[-1] == f"[sagemaker local] local-1 Completed; model in {ml}/model"
    # A failing command: its reason as the container leaves it (/opt/ml/output/failure).
    (work / "train.py").write_text("raise SystemExit(3)\n")

    def failing(argv, env):
        ml = Path(argv[argv.index("-v") + 1].split(":", 1)[0])
        (ml / "output/failure").write_text("python3 exited with code 3 on algo-1")
        return 1
    assert sm.run_local(dataclasses.replace(opts, name="local-2"), out=printed.append,
                        runner=failing) == ("local-2", 1)
    assert printed[-1] == "[sagemaker local] local-2 Failed: python3 exited with code 3 on algo-1"


@pytest.mark.parametrize("kw, message", [
    ({"instances": 2}, "--instances 2: --local runs one instance"),
    ({"inputs": {"d": "s3://b/x"}}, "--input d=s3://b/x: --local takes local directories only"),
    ({"input_tasks": {"p": "prep"}}, "--input-task: not with --local"),
])
def test_local_refusals_make_nothing(tmp_path, kw, message):
    work = _work(tmp_path)
    with pytest.raises(LaunchError, match=re.escape(message)):
        sm.run_local(_opts(work, tmp_path, download=tmp_path / "out", **kw), runner=lambda a, e: 0)
    assert not (tmp_path / "out").exists()


def test_local_runs_the_docker_on_path(tmp_path, monkeypatch):
    """--local runs `docker` from PATH (Docker Desktop's /usr/local/bin/docker on a laptop), not
    a fixed /usr/bin/docker; with none anywhere, one line and nothing left."""
    from dtrain import engine

    work = _work(tmp_path)
    (work / "train.py").write_text("print(1)\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "docker"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/argv\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))  # only the fake: never a real engine
    monkeypatch.setattr(engine, "DOCKER_CLI", tmp_path / "no-docker")
    opts = _opts(work, tmp_path, role_arn="", command=("python3", "train.py"), download=tmp_path / "out",
                 task="local", name="local-path")
    assert sm.run_local(opts, out=lambda _m: None) == ("local-path", 0)
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[0] == "run" and argv[-2:] == [IMAGE, "train"], argv
    fake.unlink()
    with pytest.raises(LaunchError, match=r"^--local: no `docker` on PATH: install Docker"):
        sm.run_local(dataclasses.replace(opts, name="local-none"), out=lambda _m: None)
    assert not (tmp_path / "out/local-none").exists()


@pytest.mark.docker
def test_local_runs_the_image_train_on_the_real_engine(cpu_images, tmp_path):
    """`--local` on this machine's engine with the pytorch-ddp CPU image: the image's own `train`
    (sagemaker_train.py) reads the tree dtrain laid out, runs the command with the channel and
    the dependency on its paths, and the model lands on the host; a failing command's reason
    comes back from /opt/ml/output/failure."""
    work = _work(tmp_path)
    (work / "train.py").write_text(TRAIN_PY)
    data, lib = _local_inputs(tmp_path)
    printed: list[str] = []
    opts = _opts(work, tmp_path, image=cpu_images["pytorch-ddp"].ref, role_arn="", command=("python3", "train.py"),
                 inputs={"train": str(data)}, dependencies={"mylib": lib}, download=tmp_path / "out",
                 task="local", name="local-real")
    assert sm.run_local(opts, out=printed.append) == ("local-real", 0), printed
    ml = tmp_path / "out/local-real/opt-ml"
    assert json.loads((ml / "model/model.json").read_text()) == {"total": 3, "lib": "lib", "hosts": ["algo-1"]}
    (work / "train.py").write_text("raise SystemExit(3)\n")
    assert sm.run_local(dataclasses.replace(opts, name="local-real-2"), out=printed.append)[1] == 1
    assert printed[-1].startswith("[sagemaker local] local-real-2 Failed: ") and "3" in printed[-1], printed[-1]

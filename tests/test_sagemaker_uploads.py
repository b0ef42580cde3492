"""What leaves the machine with `dtrain sagemaker run` (issue 38): the workdir's files that hold
secrets stay here, from a directory that is not a git repository too (launch --workdir's rules,
launch/jobs/workdir.py); a job name that exists, a --download inside an --input directory and an
image outside ECR are refused before anything is uploaded. AWS is moto, on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from dtrain.launch.errors import LaunchError
from dtrain.launch.sagemaker import engine as sm
from test_sagemaker import IMAGE, ROLE

ROOT = Path(__file__).resolve().parent.parent
MARKER = "s3cr3t-marker-38"


@pytest.fixture(autouse=True)
def _no_instance_metadata(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _project(tmp_path: Path) -> Path:
    """A user's project, not a git repository, with the files a careless user has there."""
    p = tmp_path / "proj"
    for rel, text in {"main.py": "print('train')\n", "lib/util.py": "X = 1\n", ".env": f"TOKEN={MARKER}\n",
                      "id_rsa": MARKER, ".aws/credentials": f"aws_secret_access_key = {MARKER}\n",
                      ".env.example": "TOKEN=\n", "model.ckpt": "big\n",
                      ".dtrainignore": "*.ckpt\n!.env.example\n"}.items():
        (p / rel).parent.mkdir(parents=True, exist_ok=True)
        (p / rel).write_text(text)
    return p


def _keys(s3, bucket: str) -> set[str]:
    return {o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])}


def _cli(argv: list[str], cwd: Path, moto_server: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AWS_ENDPOINT_URL": moto_server, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
           "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "dtrain", "sagemaker", "run", "--image", IMAGE, "--role", ROLE,
                           "--output", "s3://proj-bucket/dtrain", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env)


def test_run_from_a_plain_directory_uploads_no_secret_and_refuses_a_name_that_exists(tmp_path, moto_server):
    s3 = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket="proj-bucket")
    project = _project(tmp_path)
    r = _cli(["--name", "job-38", "--no-wait", "--", "python", "main.py"], project, moto_server)
    assert r.returncode == 0, r.stdout + r.stderr
    code = "dtrain/job-38/code/"
    assert {k[len(code):] for k in _keys(s3, "proj-bucket") if k.startswith(code)} == {
        "main.py", "lib/util.py", ".env.example", ".dtrainignore"}  # *.ckpt ignored, .env.example re-included
    assert not any(MARKER in s3.get_object(Bucket="proj-bucket", Key=k)["Body"].read().decode(errors="replace")
                   for k in _keys(s3, "proj-bucket"))
    assert "[sagemaker] left out 3 that may hold secrets: .aws/, .env, id_rsa (to send one, add !NAME to " \
           ".dtrainignore)" in r.stdout.splitlines()
    assert MARKER not in r.stdout + r.stderr

    before = _keys(s3, "proj-bucket")
    (project / "new.py").write_text("x\n")
    again = _cli(["--name", "job-38", "--no-wait", "--", "python", "main.py"], project, moto_server)
    assert again.returncode == 2 and again.stderr.splitlines() == [
        "error: --name job-38: a training job of that name exists (Completed); give another --name, or leave "
        "--name out for a new generated name"], again.stderr
    assert "uploading" not in again.stdout and _keys(s3, "proj-bucket") == before


@pytest.mark.parametrize("image", ["registry.example.com/dtrain/pytorch-ddp:1", "dtrain/pytorch-ddp:1",
                                   "public.ecr.aws/dtrain/pytorch-ddp:1",
                                   "123456789012.dkr.ecr.us-east-1.amazonaws.com.evil.test/x:1"])
def test_an_image_outside_ecr_is_refused_in_one_line(tmp_path, image):
    r = subprocess.run([sys.executable, "-m", "dtrain", "sagemaker", "run", "--image", image, "--role", ROLE,
                        "--", "python", "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "AWS_EC2_METADATA_DISABLED": "true"})
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"error: --image {image!r}: SageMaker runs images from Amazon ECR only: expected "
        "ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG (dtrain push --ecr puts one there)"], r.stderr
    assert not (tmp_path / "output").exists()


class _NoAWS:
    """A session for input that must be refused before the first AWS call."""

    region_name = "us-east-1"

    def client(self, name, **kw):
        raise AssertionError(f"an AWS client ({name}) was made for refused input")


def _opts(tmp_path: Path, **kw) -> sm.RunOptions:
    return sm.run_options(**{**dict(image=IMAGE, role_arn=ROLE, command=("python", "main.py"), name="job-38",
                                   output_s3="s3://proj-bucket/dtrain", workdir=_project(tmp_path), wait=False), **kw})


@pytest.mark.parametrize("download", ["data", "data/out", "data/../data/deeper/x"])
def test_download_inside_an_input_directory_is_refused_before_aws(tmp_path, download):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.csv").write_text("1\n")
    with pytest.raises(LaunchError) as e:
        sm.run(_opts(tmp_path, inputs={"train": str(data)}, download=tmp_path / download), session=_NoAWS())
    assert str(e.value) == (f"--download {tmp_path / download}: inside --input train={data}; the next run would "
                            "upload the outputs as data (and a download would overwrite inputs): give a --download "
                            "directory outside it")
    sm.check_download_dir(tmp_path / "out", {"train": data})  # beside it: fine
    sm.check_download_dir(tmp_path / "dat", {"train": data})  # a name that only starts the same


def test_download_inside_an_input_directory_is_one_line_from_the_cli(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "main.py").write_text("x\n")
    r = subprocess.run([sys.executable, "-m", "dtrain", "sagemaker", "run", "--image", IMAGE, "--role", ROLE,
                        "--input", "train=data", "--download", "data/output", "--", "python", "main.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "AWS_EC2_METADATA_DISABLED": "true",
                            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: --download data/output: inside --input train="), r.stderr


def test_other_refusals_come_before_any_aws_call(tmp_path):
    for kw, message in [(dict(image="docker.io/library/python:3"), "--image 'docker.io/library/python:3': SageMaker"),
                        (dict(state_s3="http://x"), "--state-dir 'http://x': expected s3://"),
                        (dict(role_arn="not-an-arn"), "CreateTrainingJob request: "),
                        (dict(name="bad_name"), "--name 'bad_name': expected letters")]:
        with pytest.raises(LaunchError, match=message):
            sm.run(_opts(tmp_path, **kw), session=_NoAWS())


def test_a_generated_name_that_exists_is_refused_too(aws, tmp_path):
    aws.client("s3").create_bucket(Bucket="proj-bucket")
    sm.run(_opts(tmp_path), session=aws, out=lambda _: None, poll_s=0)
    with pytest.raises(LaunchError, match="^job name job-38: a training job of that name exists"):
        sm.check_new_job_name(aws.client("sagemaker"), "job-38", given=False)
    sm.check_new_job_name(aws.client("sagemaker"), "job-39", given=False)  # none: no error


def test_symlinks_upload_only_what_the_rules_let_go(tmp_path):
    p = _project(tmp_path)
    (p / "env_copy").symlink_to(".env")  # S3 would get .env's content under another name
    (p / "passwd").symlink_to("/etc/passwd")  # out of the workdir
    (p / "lib_link").symlink_to("lib")  # a directory
    (p / "util.py").symlink_to("lib/util.py")  # a file that goes: its content goes
    files, _, left_out, links = sm.code_selection(p)
    assert [f.as_posix() for f in files] == [".dtrainignore", ".env.example", "lib/util.py", "main.py", "util.py"]
    assert left_out == [".aws/", ".env", "id_rsa"] and links == ["env_copy", "lib_link", "passwd"]
    assert sm.left_out_lines(left_out, links)[1] == (
        "left out 3 symlink(s) leading out of the directory or to a file left out: env_copy, lib_link, passwd")


# ---------------------------------------------------------------- --input DIR, --dependencies DIR (issue 47)

PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow" + MARKER + "\n-----END RSA PRIVATE KEY-----\n"


def test_input_and_dependency_directories_upload_no_secret_and_follow_no_link_out(tmp_path, moto_server):
    """--input NAME=DIR was uploaded whole (links followed out of it); --dependencies had the
    workdir's rules but the names only. Now: secrets by name, content and hard link stay here,
    a link out of the directory or a FIFO is not read, in both; a nested .dtrainignore sends
    nothing back."""
    s3 = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket="proj-bucket")
    project = _project(tmp_path)
    outside = tmp_path / "home-secret"
    outside.write_text(MARKER)
    data, deps = tmp_path / "data", tmp_path / "mylib"
    for rel, text in {"data/train.csv": "a,b\n1,2\n", "data/sub/val.csv": "a,b\n", "data/.env": MARKER,
                      "data/id_test": PEM, "data/GCP-KEY.json": "{}", "data/notes.txt": f"AWS_PASSWORD={MARKER}\n",
                      "mylib/__init__.py": "X = 1\n", "mylib/prod.env": MARKER, "mylib/vendor/.dtrainignore": "!*\n",
                      "mylib/vendor/kubeconfig": MARKER, "mylib/vendor/keep.py": "Y = 2\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    for d in (data, deps):
        (d / "out_link").symlink_to(outside)
        (d / "dir_link").symlink_to(tmp_path / "proj")
        os.mkfifo(d / "pipe")
    os.link(data / ".env", data / "copy.csv")
    (data / "train_link.csv").symlink_to("train.csv")  # inside and sent: its content goes
    r = _cli(["--name", "job-47", "--no-wait", "--input", f"train={data}", "--dependencies", str(deps), "--",
              "python", "main.py"], project, moto_server)
    assert r.returncode == 0, r.stdout + r.stderr
    keys = _keys(s3, "proj-bucket")
    base = "dtrain/job-47/"
    assert {k[len(base + "input/train/"):] for k in keys if k.startswith(base + "input/train/")} == {
        "train.csv", "sub/val.csv", "train_link.csv"}
    assert {k[len(base + "deps/mylib/"):] for k in keys if k.startswith(base + "deps/mylib/")} == {
        "__init__.py", "vendor/.dtrainignore", "vendor/keep.py"}
    for k in keys:
        assert MARKER.encode() not in s3.get_object(Bucket="proj-bucket", Key=k)["Body"].read(), k
    lines = r.stdout.splitlines()
    assert ("[sagemaker] --input train: left out 5 that may hold secrets: .env, GCP-KEY.json, copy.csv, id_test, "
            "notes.txt (to send one, put it in S3 yourself and pass --input NAME=s3://BUCKET/PREFIX)") in lines, lines
    assert ("[sagemaker] --input train: left out 2 symlink(s) leading out of the directory or to a file left out: "
            "dir_link, out_link") in lines
    assert any(line.startswith("[sagemaker] mylib: left out 2 that may hold secrets: prod.env, vendor/kubeconfig")
               for line in lines), lines
    assert MARKER not in r.stdout + r.stderr


def test_the_code_upload_leaves_out_issue_47s_files_by_name_content_and_hard_link(tmp_path, moto_server):
    """The files the issue found uploaded (prod.env, service-account.json, ..., a PEM key named
    id_test, a hard link to .env under another name), and a nested .dtrainignore's `!*`."""
    from test_workdir import BY_CONTENT, ISSUE_47, MARK, NOT_SECRETS

    s3 = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket="proj-bucket")
    project = tmp_path / "proj"
    tree = {**ISSUE_47, **BY_CONTENT, **NOT_SECRETS, "main.py": "print(1)\n", "vendor/.dtrainignore": "!*\n",
            "vendor/.env": MARKER}
    for rel, text in tree.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)
    os.link(project / ".ENV", project / "notes.txt")
    r = _cli(["--name", "job-47b", "--no-wait", "--", "python", "main.py"], project, moto_server)
    assert r.returncode == 0, r.stdout + r.stderr
    code = "dtrain/job-47b/code/"
    assert {k[len(code):] for k in _keys(s3, "proj-bucket") if k.startswith(code)} == {
        *NOT_SECRETS, "main.py", "vendor/.dtrainignore"}
    for k in _keys(s3, "proj-bucket"):
        assert MARK.encode() not in s3.get_object(Bucket="proj-bucket", Key=k)["Body"].read(), k
    assert MARK not in r.stdout + r.stderr

"""The price before anything bills (issue 49): the price-list snapshot in the Pricing API's
shape (botocore's GetProducts output and the PriceList documents' structure), the API read
through a botocore Stubber (moto has no Pricing API), `nodes up` on moto showing its price with
source and date, asking, refusing without a terminal, creating nothing when not confirmed."""

from __future__ import annotations

import json
import re

import boto3
import botocore.session
import pytest
from botocore.stub import ANY, Stubber
from botocore.validate import ParamValidator
from moto import mock_aws

from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import ec2, pricing

REGION = "us-east-1"
AMI_PARAM = "/dtrain-test/dlami"


def _get_products_output():
    return botocore.session.get_session().get_service_model("pricing").operation_model("GetProducts").output_shape


def _check_document(doc: dict) -> None:
    """The price list's JSON document structure: product (productFamily, attributes, sku),
    serviceCode, terms.OnDemand.TERM.priceDimensions.RATE (unit, pricePerUnit.USD), dates."""
    assert set(doc) >= {"product", "serviceCode", "terms", "version", "publicationDate"}, doc.keys()
    product = doc["product"]
    assert isinstance(product["attributes"], dict) and product["sku"] and product["productFamily"]
    assert product["attributes"].get("regionCode") in pricing.SNAPSHOT_REGIONS
    terms = doc["terms"]["OnDemand"]
    assert terms
    for code, term in terms.items():
        assert code == f"{term['sku']}.{term['offerTermCode']}" and term["sku"] == product["sku"]
        for rate, dim in term["priceDimensions"].items():
            assert rate == dim["rateCode"] and dim["unit"] in ("Hrs", "GB-Mo")
            assert float(dim["pricePerUnit"]["USD"]) > 0
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", doc["publicationDate"])


def test_the_snapshot_is_get_products_answers_in_botocores_shape():
    doc = json.loads(pricing.SNAPSHOT.read_text())
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", doc["snapshot"]["date"]) and doc["snapshot"]["source"]
    for service, response in doc["GetProducts"].items():
        report = ParamValidator().validate(response, _get_products_output())
        assert not report.has_errors(), report.generate_report()
        for text in response["PriceList"]:
            item = json.loads(text)
            assert item["serviceCode"] == service
            _check_document(item)
            assert pricing.key_of(item) is not None, item["product"]


def test_the_shape_checks_can_fail():
    report = ParamValidator().validate({"PriceList": [{"product": {}}], "Next": 1}, _get_products_output())
    assert report.has_errors()
    with pytest.raises(AssertionError):
        _check_document({"product": {"attributes": {"regionCode": REGION}, "sku": "x", "productFamily": "y"},
                         "serviceCode": "AmazonEC2",
                         "terms": {"OnDemand": {}}, "version": "1", "publicationDate": "2026-01-01T00:00:00Z"})


def test_snapshot_prices():
    book = pricing.snapshot()
    p4d = book.get(("ec2", "us-east-1", "p4d.24xlarge"), "p4d.24xlarge")
    assert p4d.usd == pytest.approx(21.957642) and p4d.unit == "Hrs"
    assert "AWS price list snapshot of " in p4d.source and "published 2026-07-20" in p4d.source
    assert book.get(("ec2", "us-east-1", "p5en.48xlarge"), "x").usd == pytest.approx(63.296)
    assert book.get(("ipv4", "eu-west-1"), "x").usd == 0.005
    gp3 = book.get(("ebs", "us-east-1", "gp3"), "x")
    assert gp3.unit == "GB-Mo" and gp3.hourly(730) == pytest.approx(0.08)
    assert book.get(("ml", "us-east-1", "ml.g5.xlarge"), "x").usd == 1.408
    missing = book.get(("ec2", "eu-west-1", "p5en.48xlarge"), "p5en.48xlarge on-demand")
    assert missing.usd is None and missing.missing.startswith("p5en.48xlarge on-demand in eu-west-1: not in the AWS "
                                                              "price list snapshot of ")


def _live_doc(usd: float) -> str:
    return pricing.price_document("AmazonEC2", "Compute Instance", {
        "instanceType": "g6e.12xlarge", "regionCode": REGION, **pricing.EC2_FILTERS}, usd, "Hrs",
        "2026-11-01T00:00:00Z")


class _Session:
    """A boto3 session whose `pricing` client is the given (stubbed) one."""

    def __init__(self, client, region=REGION):
        self.client_, self.region_name = client, region

    def client(self, service, region_name=None):
        assert service == "pricing" and region_name == pricing.PRICING_REGION
        return self.client_


def _pricing_client():
    return boto3.client("pricing", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")


def test_live_price_from_the_pricing_api_through_a_stubber(monkeypatch):
    monkeypatch.delenv(pricing.PRICES_ENV, raising=False)
    client = _pricing_client()
    with Stubber(client) as stub:  # the Stubber checks the request and the answer against botocore's model
        service, filters = pricing.filters_for(("ec2", REGION, "g6e.12xlarge"))
        stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [_live_doc(9.99)]},
                          {"ServiceCode": service, "Filters": filters, "FormatVersion": "aws_v1"})
        book = pricing.live_book(_Session(client), [("ec2", REGION, "g6e.12xlarge")])
        stub.assert_no_pending_responses()
    price = book.get(("ec2", REGION, "g6e.12xlarge"), "g6e.12xlarge")
    assert price.usd == 9.99 and price.source.startswith("AWS Pricing API of ")
    assert book.get(("ec2", REGION, "p4d.24xlarge"), "x").usd == pytest.approx(21.957642)  # the rest: snapshot


def test_a_pricing_api_failure_falls_back_to_the_snapshot_and_says_why(monkeypatch):
    monkeypatch.delenv(pricing.PRICES_ENV, raising=False)
    client = _pricing_client()
    with Stubber(client) as stub:
        stub.add_client_error("get_products", "AccessDeniedException", "not allowed", expected_params=None)
        book = pricing.live_book(_Session(client), [("ec2", REGION, "g6e.12xlarge")])
    assert book.source == "AWS price list snapshot" and "Pricing API not used" in book.note
    assert "AccessDeniedException" in book.note


def test_refresh_keeps_the_on_demand_terms_in_the_models_shape():
    client = _pricing_client()
    keys = [("ec2", REGION, "g6e.12xlarge"), ("ml", REGION, "ml.g5.xlarge"), ("ebs", REGION, "gp2"),
            ("ebs", REGION, "gp3"), ("ebs", REGION, "io2"), ("nat", REGION), ("ipv4", REGION)]
    answers = {("ec2", REGION, "g6e.12xlarge"): _live_doc(10.49)}
    with Stubber(client) as stub:
        for key in keys:
            doc = answers.get(key)
            stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [doc] if doc else []},
                              {"ServiceCode": ANY, "Filters": ANY, "FormatVersion": "aws_v1"})
        out = pricing.refresh(client, ["g6e.12xlarge"], ["ml.g5.xlarge"], regions=[REGION], today="2026-11-02")
    assert out["snapshot"]["date"] == "2026-11-02"
    for response in out["GetProducts"].values():
        assert not ParamValidator().validate(response, _get_products_output()).has_errors()
    [item] = out["GetProducts"]["AmazonEC2"]["PriceList"]
    assert pricing.on_demand(json.loads(item)) == (10.49, "Hrs")


def test_quote_lines_name_source_and_date_and_total():
    book = pricing.snapshot()
    q = pricing.cluster_quote(book, REGION, "p5en.48xlarge", 2, addresses=2, root_gb=200)
    text = q.text(hours=3)
    assert text[0].startswith("[price] 2 x p5en.48xlarge on-demand: $126.592/h (AWS price list snapshot of ")
    assert "published 2026-07-20" in text[0]
    assert text[1].startswith("[price] 2 x Elastic IP (public IPv4): $0.010/h")
    assert text[2].startswith("[price] 2 x 200 GiB gp3 root volume: $0.044/h")
    assert q.total == pytest.approx(126.592 + 0.01 + 400 * 0.08 / 730)
    assert text[3] == f"[price] total: ${q.total:,.2f}/h, ${q.total * 3:,.2f} for 3 h"
    unknown = pricing.cluster_quote(book, "eu-west-1", "p5en.48xlarge", 2)
    assert unknown.total is None and "not in the AWS price list snapshot" in unknown.text()[0]
    assert unknown.text()[-1] == "[price] total: unknown per hour (no price for 2 x p5en.48xlarge on-demand)"


def test_decide():
    assert pricing.decide(5.0, 10, yes=False, tty=False) == "go"
    assert pricing.decide(50.0, 10, yes=False, tty=True) == "ask"
    assert pricing.decide(50.0, 10, yes=False, tty=False) == "refuse"
    assert pricing.decide(None, 10, yes=False, tty=False) == "refuse"  # unknown: never silently
    assert pricing.decide(None, 10, yes=True, tty=False) == "go"


def test_threshold_from_flag_env_default(monkeypatch):
    from dtrain.values import BadValue

    monkeypatch.delenv(pricing.CONFIRM_ENV, raising=False)
    assert pricing.threshold(None) == pricing.DEFAULT_CONFIRM_ABOVE
    monkeypatch.setenv(pricing.CONFIRM_ENV, "2.5")
    assert pricing.threshold(None) == 2.5 and pricing.threshold("0") == 0
    with pytest.raises(BadValue, match="--confirm-above"):
        pricing.threshold("lots")


def test_cluster_price_per_hour():
    record = {"region": REGION, "instance_type": "p4d.24xlarge",
              "instances": [{"public_ip": "198.51.100.1"}, {"public_ip": None}]}
    amount, why = pricing.cluster_price_per_hour(record)
    assert amount == pytest.approx(2 * 21.957642 + 0.005)
    assert why.startswith("2 x p4d.24xlarge on-demand + 1 public IPv4 (AWS price list snapshot of ")
    amount, why = pricing.cluster_price_per_hour({**record, "region": "eu-west-1"})
    assert amount is None and "not in the AWS price list snapshot" in why


# --- nodes up on moto ------------------------------------------------------------------------


@pytest.fixture
def aws(monkeypatch, tmp_path):
    monkeypatch.setenv("DTRAIN_HOME", str(tmp_path / "home"))
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", pricing.CONFIRM_ENV, pricing.PRICES_ENV):
        monkeypatch.delenv(k, raising=False)
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        session = boto3.Session(region_name=REGION)
        session.client("ssm").put_parameter(Name=AMI_PARAM, Value="ami-dca37ea5", Type="String")
        yield session


def _stacks(session) -> list[str]:
    return [s["StackName"] for s in session.client("cloudformation").describe_stacks()["Stacks"]
            if s["StackStatus"] != "DELETE_COMPLETE"]


def _spec(**kw) -> ec2.NodesSpec:
    return ec2.NodesSpec(**{**dict(name="c1", count=2, instance_type="p4d.24xlarge", ssh_cidr="203.0.113.7/32",
                                   ami=AMI_PARAM), **kw})


def _up(session, spec, said, **gate):
    gate = pricing.nodes_up_gate(session, instance_type=spec.instance_type, count=spec.count, spot=spec.spot,
                                 say=said.append, **{"above": 10.0, "yes": False, **gate})
    return ec2.start(session, spec, say=said.append, confirm=gate)


def test_nodes_up_answered_no_creates_nothing(aws):
    said, asked = [], []
    with pytest.raises(LaunchError) as e:
        _up(aws, _spec(), said, tty=True, ask=lambda q: asked.append(q) or "n", hours=2)
    assert str(e.value) == "nodes up (2 x p4d.24xlarge): not confirmed: nothing created"
    assert _stacks(aws) == []
    assert len(asked) == 1 and asked[0].startswith("nodes up (2 x p4d.24xlarge) at $43.9")
    assert asked[0].endswith("/h: go on? [y/N] ")
    rent = next(x for x in said if x.startswith("[nodes] to rent in us-east-1: "))
    assert "2 x p4d.24xlarge (on-demand)" in rent and "GiB gp3 root volume(s)" in rent
    line = next(x for x in said if x.startswith("[price] 2 x p4d.24xlarge on-demand: $43.915/h"))
    assert "AWS price list snapshot of " in line and "published 2026-07-20" in line  # source and date
    total = next(x for x in said if x.startswith("[price] total: $"))
    assert total.endswith(" for 2 h")
    assert any("Pricing API not used" in x for x in said)  # moto has no Pricing API: said, snapshot used


def test_nodes_up_with_yes_proceeds(aws):
    said: list[str] = []
    res = _up(aws, _spec(), said, yes=True, tty=False)
    assert _stacks(aws) == ["dtrain-c1"] and res.root_size > 0
    assert any(x.startswith("[price] total: $") for x in said)


def test_nodes_up_answered_yes_proceeds(aws):
    _up(aws, _spec(), [], tty=True, ask=lambda q: "y")
    assert _stacks(aws) == ["dtrain-c1"]


def test_nodes_up_without_a_terminal_above_the_threshold_refuses_in_one_line(aws):
    with pytest.raises(LaunchError) as e:
        _up(aws, _spec(), [], tty=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("nodes up (2 x p4d.24xlarge): $")
    assert "is above --confirm-above $10/h (DTRAIN_CONFIRM_ABOVE) and there is no terminal to ask: nothing " \
           "created; add --yes" in msg
    assert _stacks(aws) == []


def test_nodes_up_below_the_threshold_goes_without_asking(aws):
    said: list[str] = []
    _up(aws, _spec(instance_type="c5.xlarge", count=1, ami="cpu"), said, tty=False,
        ask=lambda q: pytest.fail("asked"))
    assert _stacks(aws) == ["dtrain-c1"]


def test_nodes_up_a_type_the_price_list_lacks_is_said_and_asked(aws):
    """m7i.large is in moto's EC2 but not in the price-list snapshot: the line says so and
    the unknown price is never taken for cheap."""
    said: list[str] = []
    with pytest.raises(LaunchError, match=r"^nodes up \(1 x m7i\.large\): an unknown price is above"):
        _up(aws, _spec(instance_type="m7i.large", count=1, ami="cpu"), said, tty=False)
    assert any(x.startswith("[price] 1 x m7i.large on-demand: unknown (m7i.large on-demand in us-east-1: not in "
                            "the AWS price list snapshot of ") for x in said), said
    assert _stacks(aws) == []


def test_nodes_up_spot_asks_ec2_for_the_spot_price(aws):
    said: list[str] = []
    _up(aws, _spec(spot=True, count=1), said, yes=True)
    line = next(x for x in said if x.startswith("[price] 1 x p4d.24xlarge spot: "))
    assert "EC2 spot price now in us-east-1" in line  # moto's DescribeSpotPriceHistory
    assert any(x.startswith("[price] spot bills the spot price of the hour, at most on-demand") for x in said)


def test_sagemaker_gate_says_the_price_and_refuses_without_a_terminal(aws):
    said: list[str] = []
    with pytest.raises(LaunchError, match=r"^sagemaker run \(2 x ml\.p4d\.24xlarge\): \$75\.38/h is above"):
        pricing.sagemaker_gate(aws, instance_type="ml.p4d.24xlarge", count=2, spot=False, above=10, yes=False,
                               hours=24, say=said.append, tty=False)
    assert said[0].startswith("[price] 2 x ml.p4d.24xlarge on-demand: $75.376/h (AWS price list snapshot of ")
    said.clear()
    pricing.sagemaker_gate(aws, instance_type="ml.m5.2xlarge", count=1, spot=True, above=10, yes=False,
                           say=said.append, tty=False)
    assert said[0].startswith("[price] 1 x ml.m5.2xlarge managed spot, at most: $0.461/h")


# --- the real program ------------------------------------------------------------------------


def test_cli_nodes_up_without_a_terminal_refuses_in_one_line_and_yes_goes_on(moto_server, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DTRAIN_"))}
    env.update(AWS_ENDPOINT_URL=moto_server, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_DEFAULT_REGION=REGION, AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               AWS_EC2_METADATA_DISABLED="true", DTRAIN_HOME=str(tmp_path / "home"), PYTHONPATH=str(root))
    # --efa-interfaces 1: one interface, no Elastic IP (moto's backends are shared by every test of the process)
    args = [sys.executable, "-m", "dtrain", "nodes", "up", "--name", "price1", "--count", "2", "--instance-type",
            "p4d.24xlarge", "--ami", "ami-dca37ea5", "--ssh-cidr", "203.0.113.7/32", "--address", "public",
            "--efa-interfaces", "1"]
    cfn = boto3.client("cloudformation", endpoint_url=moto_server, region_name=REGION,
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    r = subprocess.run([*args, "--hours", "5"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stdout + r.stderr
    assert r.stderr.startswith("error: nodes up (2 x p4d.24xlarge): $") and "add --yes" in r.stderr
    assert "[price] 2 x p4d.24xlarge on-demand: $43.915/h (AWS price list snapshot of " in r.stdout
    assert re.search(r"\[price\] total: \$[0-9.,]+/h, \$[0-9.,]+ for 5 h", r.stdout), r.stdout
    assert [st for st in cfn.describe_stacks()["Stacks"] if st["StackName"] == "dtrain-price1"] == []
    r = subprocess.run([*args, "--confirm-above", "a lot"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and r.stderr.startswith("error: --confirm-above 'a lot': "), r.stderr
    # --yes: past the price, the stack is made; ssh never leaves this machine (ProxyCommand=/bin/false:
    # moto's addresses are made up), so up fails there and deletes it
    r = subprocess.run([*args, "--yes", "--timeout", "3", "--ssh-opt", "ProxyCommand=/bin/false"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert "[nodes] stack dtrain-price1 creating: 2 x p4d.24xlarge" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 2 and r.stderr.startswith("error: no node answered ssh + docker within 3s"), r.stderr
    assert "[nodes] deleting stack dtrain-price1" in r.stdout


def test_nodes_list_price_column_from_the_snapshot():
    """`nodes list`'s $/H cell (fleet.price): the snapshot's on-demand price x count, spot as its on-demand
    ceiling, "?" where the snapshot lacks the region or type, nothing for a cluster without nodes."""
    from dtrain.launch.infra import fleet

    one = pricing.snapshot().get(("ec2", "us-east-1", "p4d.24xlarge"), "p4d").usd
    assert one and one > 10
    assert fleet.price(fleet.Row("a", "us-east-1", "CREATE_COMPLETE", "p4d.24xlarge", 2)) == f"${2 * one:,.2f}"
    assert fleet.price(fleet.Row("a", "us-east-1", "CREATE_COMPLETE", "p4d.24xlarge", 2, spot=True)) == \
        f"<=${2 * one:,.2f}"
    assert fleet.price(fleet.Row("a", "ap-south-2", "CREATE_COMPLETE", "p4d.24xlarge", 2)) == "?"
    assert fleet.price(fleet.Row("a", "us-east-1", "DELETE_FAILED")) == ""

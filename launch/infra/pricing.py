"""What dtrain's EC2 and SageMaker resources cost per hour, before anything bills.

Prices come from AWS's price list: the Pricing API (boto3 `pricing` client, GetProducts, its
us-east-1 endpoint) where it answers, else `prices.json` beside this file, a dated snapshot
of GetProducts' answers in the API's own shape (PriceList: JSON documents with product,
attributes and terms.OnDemand), for offline use and tests; `dtrain instance-types --refresh`
writes it again (`refresh`). Spot instances: the current spot price (DescribeSpotPriceHistory)
where it can be asked, else said to be unknown. Every price carries its source and date; a
region or type the price list lacks is said, never guessed.

Pure apart from `live_book`, `spot_now` and `refresh` (the AWS calls).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

SNAPSHOT = Path(__file__).with_name("prices.json")
PRICING_REGION = "us-east-1"  # the Pricing API's endpoint (it answers for every region)
HOURS_PER_MONTH = 730  # AWS's own conversion of per-month (GB-Mo) prices to hours
ON_DEMAND_TERM = "JRTCKXETXF"  # the price list's offer term code of On-Demand
HOURLY_DIMENSION = "6YS6EN2CT7"
CONFIRM_ENV = "DTRAIN_CONFIRM_ABOVE"
DEFAULT_CONFIRM_ABOVE = 10.0  # USD per hour: above it (or when the price is unknown) `nodes up` asks first
PRICES_ENV = "DTRAIN_PRICES"  # "snapshot": never ask the Pricing API (offline)
# The Pricing API's filters of each kind of product dtrain rents.
EC2_FILTERS = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}
LOCATIONS = {"us-east-1": "US East (N. Virginia)", "us-west-2": "US West (Oregon)", "eu-west-1": "EU (Ireland)",
             "us-east-2": "US East (Ohio)", "eu-central-1": "EU (Frankfurt)", "ap-northeast-1": "Asia Pacific (Tokyo)"}


# --- the price list's documents -------------------------------------------------------------


def price_document(service: str, family: str, attributes: Mapping[str, str], usd: float, unit: str,
                   published: str, description: str = "") -> str:
    """One PriceList item as GetProducts returns it (a JSON text): product (family, attributes,
    sku), serviceCode, terms.OnDemand with one price dimension, version, publicationDate. The
    sku is dtrain's own for a document written by hand (prefixed "dtrain-")."""
    sku = "dtrain-" + hashlib.sha1(json.dumps([service, dict(attributes)], sort_keys=True).encode()).hexdigest()[:12]
    term = f"{sku}.{ON_DEMAND_TERM}"
    doc = {
        "product": {"productFamily": family, "attributes": {"servicecode": service, **attributes}, "sku": sku},
        "serviceCode": service,
        "terms": {"OnDemand": {term: {
            "priceDimensions": {f"{term}.{HOURLY_DIMENSION}": {
                "unit": unit, "endRange": "Inf", "beginRange": "0", "appliesTo": [],
                "description": description or f"${usd} per {unit}", "rateCode": f"{term}.{HOURLY_DIMENSION}",
                "pricePerUnit": {"USD": f"{usd:.10f}"}}},
            "sku": sku, "effectiveDate": published, "offerTermCode": ON_DEMAND_TERM, "termAttributes": {}}}},
        "version": published.replace("-", "").replace(":", "")[:15],
        "publicationDate": published,
    }
    return json.dumps(doc, sort_keys=True)


def on_demand(doc: Mapping[str, Any]) -> tuple[float, str] | None:
    """(USD per unit, unit) of a document's first On-Demand price dimension with a USD price
    above 0 (a document's free tiers and 0-priced rows aside), or None."""
    for term in (doc.get("terms") or {}).get("OnDemand", {}).values():
        for dim in term.get("priceDimensions", {}).values():
            usd = float((dim.get("pricePerUnit") or {}).get("USD", "0") or 0)
            if usd > 0:
                return usd, dim.get("unit", "")
    return None


def key_of(doc: Mapping[str, Any]) -> tuple[str, ...] | None:
    """What a document prices, as dtrain looks it up: ("ec2", region, type), ("ml", region,
    ml.type) (SageMaker training), ("ebs", region, gp3|io2), ("nat", region), ("ipv4", region); None for
    anything else (Windows, dedicated tenancy, another product)."""
    service = doc.get("serviceCode", "")
    product = doc.get("product") or {}
    a = product.get("attributes") or {}
    region = a.get("regionCode", "")
    if service == "AmazonEC2" and a.get("instanceType") and all(a.get(k) == v for k, v in EC2_FILTERS.items()):
        return ("ec2", region, a["instanceType"])
    if service == "AmazonSageMaker" and a.get("instanceName", "").startswith("ml.") and \
            "train" in (a.get("component", "") + a.get("usagetype", "")).lower():
        return ("ml", region, a["instanceName"])
    if service == "AmazonEC2" and a.get("volumeApiName"):
        return ("ebs", region, a["volumeApiName"])
    if service == "AmazonEC2" and product.get("productFamily") == "NAT Gateway" and "Hours" in a.get("usagetype", ""):
        return ("nat", region)
    if service == "AmazonVPC" and "PublicIPv4" in a.get("usagetype", "") and "InUse" in a.get("usagetype", ""):
        return ("ipv4", region)
    return None


@dataclass(frozen=True)
class Price:
    """One price: usd per unit, or None with why (missing)."""

    usd: float | None
    unit: str  # Hrs, GB-Mo
    source: str  # where it comes from and its date
    missing: str = ""

    def hourly(self, quantity: float = 1) -> float | None:
        """USD per hour of quantity units (GB-Mo: per GB, over HOURS_PER_MONTH)."""
        if self.usd is None:
            return None
        return self.usd * quantity / (HOURS_PER_MONTH if self.unit == "GB-Mo" else 1)


@dataclass(frozen=True)
class Book:
    """Prices by key_of, each with its publication date; where they came from."""

    prices: Mapping[tuple[str, ...], tuple[float, str, str]]  # key -> (usd, unit, published)
    source: str  # "AWS price list snapshot" | "AWS Pricing API"
    taken: str  # the date the prices were taken (the snapshot's, or today for the API)
    note: str = ""  # why the API was not used, when it was not

    def get(self, key: tuple[str, ...], what: str) -> Price:
        found = self.prices.get(key)
        where = f"{self.source} of {self.taken}"
        if found is None:
            return Price(None, "", where, missing=f"{what} in {key[1]}: not in the {where}; "
                                                  "`dtrain instance-types --refresh` takes the current price list")
        usd, unit, published = found
        return Price(usd, unit, f"{where} (published {published[:10]})")

    def merged(self, other: "Book") -> "Book":
        return Book({**self.prices, **other.prices}, other.source, other.taken, other.note)


def book_from(price_lists: Sequence[str], source: str, taken: str, note: str = "") -> Book:
    prices: dict[tuple[str, ...], tuple[float, str, str]] = {}
    for text in price_lists:
        doc = json.loads(text)
        key, price = key_of(doc), on_demand(doc)
        if key and price:
            prices[key] = (price[0], price[1], doc.get("publicationDate", ""))
    return Book(prices, source, taken, note)


def load(path: Path = SNAPSHOT) -> Book:
    doc = json.loads(path.read_text())
    lists = [item for resp in doc["GetProducts"].values() for item in resp["PriceList"]]
    return book_from(lists, "AWS price list snapshot", doc["snapshot"]["date"])


@functools.lru_cache(maxsize=1)
def snapshot() -> Book:
    return load()


# --- the Pricing API ------------------------------------------------------------------------


def filters_for(key: tuple[str, ...]) -> tuple[str, list[dict[str, str]]]:
    """(ServiceCode, GetProducts Filters) that find the document of a key."""
    def term(field_: str, value: str) -> dict[str, str]:
        return {"Type": "TERM_MATCH", "Field": field_, "Value": value}

    kind, region = key[0], key[1]
    if kind == "ec2":
        return "AmazonEC2", [term("instanceType", key[2]), term("regionCode", region),
                             *(term(k, v) for k, v in EC2_FILTERS.items())]
    if kind == "ml":
        return "AmazonSageMaker", [term("instanceName", key[2]), term("regionCode", region)]
    if kind == "ebs":
        return "AmazonEC2", [term("volumeApiName", key[2]), term("regionCode", region),
                             term("productFamily", "Storage")]
    if kind == "nat":
        return "AmazonEC2", [term("productFamily", "NAT Gateway"), term("regionCode", region)]
    return "AmazonVPC", [term("regionCode", region), term("group", "VPCPublicIPv4Address")]


def get_products(client: Any, service: str, filters: list[dict[str, str]]) -> list[str]:
    """Every PriceList item of GetProducts (all pages)."""
    out: list[str] = []
    for page in client.get_paginator("get_products").paginate(ServiceCode=service, Filters=filters,
                                                              FormatVersion="aws_v1"):
        out.extend(page.get("PriceList", []))
    return out


def live_book(session: Any, keys: Sequence[tuple[str, ...]]) -> Book:
    """The snapshot, with the keys' prices from the Pricing API where it answers; the first
    failure (no permission, no network) stops asking and is said in the book's note."""
    base = snapshot()
    if os.environ.get(PRICES_ENV) == "snapshot":
        return Book(base.prices, base.source, base.taken, f"{PRICES_ENV}=snapshot")
    lists: list[str] = []
    try:
        client = session.client("pricing", region_name=PRICING_REGION)
        for key in keys:
            lists.extend(get_products(client, *filters_for(key)))
    except Exception as e:  # noqa: BLE001 - any failure: the snapshot answers, and why is said
        why = " ".join(str(e).split())[:160]
        return Book(base.prices, base.source, base.taken, f"Pricing API not used: {why}")
    live = book_from(lists, "AWS Pricing API", date.today().isoformat())
    if not live.prices:
        return Book(base.prices, base.source, base.taken, "Pricing API: no matching product")
    return base.merged(live)


def spot_now(session: Any, instance_type: str, zone: str | None = None) -> Price:
    """The current spot price (DescribeSpotPriceHistory, Linux/UNIX): in zone, else the lowest
    of the region's zones; unknown (said) where it cannot be asked."""
    try:
        now = datetime.now(timezone.utc)
        kw: dict[str, Any] = {"InstanceTypes": [instance_type], "ProductDescriptions": ["Linux/UNIX"],
                              "StartTime": now, "MaxResults": 100}
        if zone:
            kw["AvailabilityZone"] = zone
        rows = session.client("ec2").describe_spot_price_history(**kw)["SpotPriceHistory"]
    except Exception as e:  # noqa: BLE001
        return Price(None, "Hrs", "EC2 spot price history", missing=f"spot price of {instance_type}: unknown "
                     f"({' '.join(str(e).split())[:120]})")
    if not rows:
        return Price(None, "Hrs", "EC2 spot price history",
                     missing=f"spot price of {instance_type}: unknown (no spot price history answered)")
    best = min(rows, key=lambda r: float(r["SpotPrice"]))
    return Price(float(best["SpotPrice"]), "Hrs",
                 f"EC2 spot price now in {best.get('AvailabilityZone', zone or '?')} ({now:%Y-%m-%d %H:%M} UTC)")


# --- what a cluster or a job costs ----------------------------------------------------------


@dataclass(frozen=True)
class Line:
    what: str
    usd_hour: float | None
    source: str


@dataclass(frozen=True)
class Quote:
    lines: tuple[Line, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def total(self) -> float | None:
        """USD per hour of every line; None when one is unknown."""
        if any(line.usd_hour is None for line in self.lines):
            return None
        return sum(line.usd_hour or 0 for line in self.lines)

    def text(self, hours: float | None = None, prefix: str = "[price]") -> list[str]:
        """One line per item, with its source and date, then the total (and for hours)."""
        out = [f"{prefix} {line.what}: " + (f"${line.usd_hour:,.3f}/h" if line.usd_hour is not None
                                           else "unknown") + f" ({line.source})" for line in self.lines]
        total = self.total
        if total is None:
            unknown = ", ".join(line.what for line in self.lines if line.usd_hour is None)
            out.append(f"{prefix} total: unknown per hour (no price for {unknown})")
        else:
            out.append(f"{prefix} total: ${total:,.2f}/h" + (f", ${total * hours:,.2f} for {hours:g} h" if hours else ""))
        return out + [f"{prefix} {n}" for n in self.notes]


def _line(what: str, price: Price, quantity: float = 1) -> Line:
    if price.usd is None:
        return Line(what, None, price.missing)
    return Line(what, price.hourly(quantity), price.source)


def cluster_quote(book: Book, region: str, instance_type: str, count: int, *, spot: bool = False,
                  spot_price: Price | None = None, addresses: int = 0, root_gb: int = 0,
                  volume_type: str = "gp3") -> Quote:
    """What `nodes up` rents, per hour (pure): count x the type (on-demand, or spot at
    spot_price), the Elastic IPs (public IPv4), the root volumes."""
    lines = []
    if spot:
        sp = spot_price or Price(None, "Hrs", "", missing=f"spot price of {instance_type}: unknown")
        od = book.get(("ec2", region, instance_type), f"{instance_type} on-demand")
        lines.append(_line(f"{count} x {instance_type} spot", sp, count))
        notes = ((f"spot bills the spot price of the hour, at most on-demand "
                  f"(${od.usd * count:,.3f}/h for {count}, {od.source})",) if od.usd is not None else ())
    else:
        lines.append(_line(f"{count} x {instance_type} on-demand",
                           book.get(("ec2", region, instance_type), f"{instance_type} on-demand"), count))
        notes = ()
    if addresses:
        lines.append(_line(f"{addresses} x Elastic IP (public IPv4)", book.get(("ipv4", region), "public IPv4"),
                           addresses))
    if root_gb:
        lines.append(_line(f"{count} x {root_gb} GiB {volume_type} root volume",
                           book.get(("ebs", region, volume_type), f"EBS {volume_type}"), count * root_gb))
    if book.note:
        notes = (*notes, book.note)
    return Quote(tuple(lines), notes)


def sagemaker_quote(book: Book, region: str, instance_type: str, count: int, *, spot: bool = False) -> Quote:
    """A SageMaker training job's instances per hour (pure). Managed spot bills less than
    on-demand by a share SageMaker sets per job: the on-demand price is its upper bound. Its
    ML storage volumes (--volume-size) bill per GB-month on top, not counted here."""
    price = book.get(("ml", region, instance_type), f"{instance_type} (SageMaker training)")
    what = f"{count} x {instance_type} " + ("managed spot, at most" if spot else "on-demand")
    notes = (("managed spot saves up to 90% of on-demand; the job's billable seconds say what it cost",)
             if spot else ())
    return Quote((_line(what, price, count),), (*notes, *((book.note,) if book.note else ())))


def cluster_price_per_hour(record: Any) -> tuple[float | None, str]:
    """A cluster's price per hour from its record (cluster.json: an ec2.Cluster or its dict):
    its instances (on-demand, or spot where the record says spot) and their public IPv4
    addresses, from the price-list snapshot (no AWS call: for `nodes list`). (None, why) when
    the snapshot lacks the type or region."""
    get: Callable[[str, Any], Any] = (record.get if isinstance(record, Mapping)
                                      else lambda k, d=None: getattr(record, k, d))
    region, itype = get("region", ""), get("instance_type", "")
    instances = list(get("instances", ()) or ())
    public = sum(1 for i in instances if (i.get("public_ip") if isinstance(i, Mapping) else getattr(i, "public_ip", None)))
    book = snapshot()
    od = book.get(("ec2", region, itype), f"{itype} on-demand")
    if od.usd is None:
        return None, od.missing
    if get("spot", False):
        return None, f"{len(instances)} x {itype} spot: the spot price of the hour (at most ${od.usd * len(instances):,.2f}/h)"
    ip = book.get(("ipv4", region), "public IPv4")
    total = od.usd * len(instances) + (ip.usd or 0) * public
    return total, f"{len(instances)} x {itype} on-demand" + (f" + {public} public IPv4" if public else "") + \
        f" ({book.source} of {book.taken})"


# --- the confirmation ---------------------------------------------------------------------


def threshold(flag: str | None) -> float:
    """USD per hour above which to ask: --confirm-above, else $DTRAIN_CONFIRM_ABOVE, else the default."""
    from dtrain import values

    if flag is not None:
        return values.number("--confirm-above", flag, 0, or_equal=True)
    env = os.environ.get(CONFIRM_ENV)
    if env is not None and env.strip():
        return values.number(CONFIRM_ENV, env, 0, or_equal=True)
    return DEFAULT_CONFIRM_ABOVE


def decide(total: float | None, above: float, *, yes: bool, tty: bool) -> str:
    """go, ask or refuse (pure): --yes goes; a known total at or below the threshold goes;
    above it, or unknown, a terminal is asked and anything else refused."""
    if yes or (total is not None and total <= above):
        return "go"
    return "ask" if tty else "refuse"


def confirm(quote: Quote, above: float, *, yes: bool, what: str, say: Callable[[str], None] = print,
            hours: float | None = None, tty: bool | None = None,
            ask: Callable[[str], str] = input) -> None:
    """Say the quote; go on, ask (y/N), or refuse in one line (LaunchError, nothing made)."""
    import sys

    from dtrain.launch.errors import LaunchError

    for line in quote.text(hours):
        say(line)
    tty = sys.stdin.isatty() if tty is None else tty
    total = quote.total
    price = "an unknown price" if total is None else f"${total:,.2f}/h"
    verdict = decide(total, above, yes=yes, tty=tty)
    if verdict == "go":
        return
    if verdict == "refuse":
        raise LaunchError(f"{what}: {price} is above --confirm-above ${above:g}/h ({CONFIRM_ENV}) and there is no "
                          f"terminal to ask: nothing created; add --yes to go on, or raise --confirm-above")
    try:
        answer = ask(f"{what} at {price}: go on? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise LaunchError(f"{what}: not confirmed: nothing created")


def nodes_up_gate(session: Any, *, instance_type: str, count: int, spot: bool, above: float, yes: bool,
                  hours: float | None = None, say: Callable[[str], None] = print, tty: bool | None = None,
                  ask: Callable[[str], str] = input) -> Callable[[Any], None]:
    """ec2.start's confirm: given what preflight resolved (zone, Elastic IPs, root disk), say
    what `nodes up` rents and its price per hour (and for hours), then go on, ask, or refuse."""
    def gate(res: Any) -> None:
        region = session.region_name
        keys = [("ec2", region, instance_type), ("ebs", region, "gp3")] + ([("ipv4", region)] if res.addresses else [])
        book = live_book(session, keys)
        spot_price = spot_now(session, instance_type, res.availability_zone) if spot else None
        say(f"[nodes] to rent in {region}: {count} x {instance_type} ({'spot' if spot else 'on-demand'}), "
            + (f"{res.addresses} Elastic IP(s), " if res.addresses else "")
            + f"{count} x {res.root_size} GiB gp3 root volume(s)")
        quote = cluster_quote(book, region, instance_type, count, spot=spot, spot_price=spot_price,
                              addresses=res.addresses, root_gb=res.root_size)
        confirm(quote, above, yes=yes, what=f"nodes up ({count} x {instance_type})", say=say, hours=hours,
                tty=tty, ask=ask)
    return gate


def sagemaker_gate(session: Any, *, instance_type: str, count: int, spot: bool, above: float, yes: bool,
                   hours: float | None = None, say: Callable[[str], None] = print, tty: bool | None = None,
                   ask: Callable[[str], str] = input) -> None:
    """`sagemaker run`'s confirm, before the job's first AWS call: its instances' price per hour
    (and for the run-time limit), then go on, ask, or refuse. Without a region the job's own
    error says so."""
    region = session.region_name
    if not region:
        return
    book = live_book(session, [("ml", region, instance_type)])
    quote = sagemaker_quote(book, region, instance_type, count, spot=spot)
    confirm(quote, above, yes=yes, what=f"sagemaker run ({count} x {instance_type})", say=say, hours=hours,
            tty=tty, ask=ask)


# --- the snapshot from the Pricing API (`dtrain instance-types --refresh`) ------------------


SNAPSHOT_REGIONS = ("us-east-1", "us-west-2", "eu-west-1")


def refresh(client: Any, ec2_types: Sequence[str], ml_types: Sequence[str],
            regions: Sequence[str] = SNAPSHOT_REGIONS, *, today: str | None = None) -> dict[str, Any]:
    """The snapshot document from GetProducts (client: a boto3 `pricing` client in
    us-east-1): the EC2 types, the SageMaker types, gp2/gp3/io2, NAT gateway and public IPv4
    in each region. Each item is trimmed to its On-Demand terms."""
    keys: list[tuple[str, ...]] = []
    for r in regions:
        keys += [("ec2", r, t) for t in ec2_types] + [("ml", r, t) for t in ml_types]
        keys += [("ebs", r, v) for v in ("gp2", "gp3", "io2")] + [("nat", r), ("ipv4", r)]
    by_service: dict[str, list[str]] = {}
    for key in keys:
        service, filters = filters_for(key)
        for text in get_products(client, service, filters):
            doc = json.loads(text)
            if key_of(doc) != key:
                continue
            doc["terms"] = {"OnDemand": doc.get("terms", {}).get("OnDemand", {})}
            by_service.setdefault(service, []).append(json.dumps(doc, sort_keys=True))
    return {"snapshot": {"date": today or date.today().isoformat(), "source": "AWS Pricing API GetProducts "
                         "(dtrain instance-types --refresh)", "regions": list(regions)},
            "GetProducts": {s: {"FormatVersion": "aws_v1", "PriceList": items} for s, items in sorted(by_service.items())}}


def write(doc: Mapping[str, Any], path: Path = SNAPSHOT) -> Path:
    path.write_text(json.dumps(doc, indent=1) + "\n")
    snapshot.cache_clear()
    return path


def refresh_all(session: Any, say: Callable[[str], None] = print) -> None:
    """`dtrain instance-types --refresh`: both snapshots from AWS with the caller's credentials:
    the instance types (DescribeInstanceTypes, the session's region), then their prices and
    SageMaker's (GetProducts) in SNAPSHOT_REGIONS."""
    import botocore.session

    from dtrain.launch.infra import instance_types

    doc = instance_types.refresh(session.client("ec2"))
    path = instance_types.write(doc)
    types = [e["InstanceType"] for e in doc["DescribeInstanceTypes"]["InstanceTypes"]]
    say(f"{path}: {len(types)} instance types from DescribeInstanceTypes ({doc['snapshot']['date']})")
    trainable = set(botocore.session.get_session().get_service_model("sagemaker").shape_for(
        "TrainingInstanceType").enum)
    ml = [f"ml.{t}" for t in types if f"ml.{t}" in trainable]
    prices = refresh(session.client("pricing", region_name=PRICING_REGION), types, ml)
    path = write(prices)
    count = sum(len(r["PriceList"]) for r in prices["GetProducts"].values())
    say(f"{path}: {count} prices from the Pricing API ({prices['snapshot']['date']}, {', '.join(SNAPSHOT_REGIONS)})")


def type_table(region: str) -> list[str]:
    """`dtrain instance-types`: each type of the snapshot in one line, with its on-demand price
    in region (or that the price list lacks it)."""
    from dtrain.launch.infra import instance_types

    snap, book = instance_types.snapshot(), snapshot()
    out = [f"# EC2 DescribeInstanceTypes of {snap.taken} ({snap.region}); prices: {book.source} of {book.taken}, {region}"]
    for itype, entry in snap.types.items():
        price = book.get(("ec2", region, itype), itype)
        out.append(instance_types.summary(entry) + (f"; ${price.usd:,.4f}/h on-demand" if price.usd is not None
                                                   else "; price: not in the snapshot"))
    return out

"""`dtrain nodes`, `instance-types`, `volume`, `cluster`, `demo`: where nodes come from (the work:
launch/infra/, launch/demo.py).

Each task is declared here, beside its body: tasks.py names them for Invoke."""

from __future__ import annotations

import sys

from dtrain.launch.cli_support import task, user_errors, _int_flag, _choice_flag  # noqa: F401
from dtrain.launch.cli.jobs import NODE_HELP, _nodes, _ssh_opts


def _aws(profile, region):
    import boto3

    return boto3.Session(profile_name=profile, region_name=region)


@task(iterable=["ssh_opt", "s3_bucket"], help={
    "action": "up, down, list or sync (the hostfile follows the Auto Scaling group: a replaced node joins)",
    "all_regions": "with list: every region of the account (DescribeRegions), not only those dtrain has used here",
    "name": "cluster name (stack dtrain-NAME; instances tagged dtrain:cluster=NAME)",
    "count": "instances wanted", "min_count": "go on with this many if fewer start (default: --count)",
    "instance_type": "EC2 instance type, e.g. p4d.24xlarge", "spot": "spot instances (launch template)",
    "subnet": "subnet for the nodes (default: the default VPC's subnet in a zone that offers the type)",
    "new_vpc": "make a VPC in the stack",
    "key_name": "EC2 key pair for ssh", "ssh_key": "its private key file here (written into the hostfile)",
    "ssh_cidr": "who may ssh in (default: this machine's security group inside the VPC, else its public address /32)",
    "efs": "an EFS file system (kept by `nodes down`; mounted at boot at /efs, $EFS_MOUNT)",
    "lazy": "nodes load images lazily (SOCI snapshotter from the node's apt, Docker on the containerd store; the "
            "default, --no-lazy: classic); images `dtrain push` indexed",
    "address": "hostfile addresses: auto (default: private from inside the nodes' VPC, else public), private or public",
    "efa_interfaces": "EFA interfaces per node (default: every one the type has, e.g. 4 on p4d.24xlarge)",
    "ssh_opt": NODE_HELP["ssh_opt"] + "; kept for `--cluster NAME`, e.g. ProxyJump=bastion",
    "region": "AWS region (down: default the cluster's, from its record or the regions dtrain has used)",
    "profile": "AWS profile",
    "timeout": "seconds to wait for capacity, and again for ssh + docker (default 900)",
    "keep_on_failure": "keep the stack when up fails (default: delete it)",
    "ssh_user": "ssh user on the nodes (default: the AMI's: ubuntu, ec2-user)",
    "ami": "gpu (Deep Learning AMI), cpu (ECS-optimized AL2023), ami-ID or an SSM parameter path "
           "(default: gpu on GPU types, else cpu)",
    "root_size": "root disk GiB (default: the AMI's + 3 x the largest image + 100)",
    "s3_bucket": "a bucket the nodes' role may read (repeatable; s3://NAME accepted)",
    "s3_write": "the role may also write to the --s3-bucket buckets (checkpoints)",
    "instance_profile": "an existing instance profile instead of the stack's role, or none",
    "delete_data": "with down: delete the cluster's dataset volumes and EFS too (default: kept)",
    "yes": "with up: go on without asking, whatever the price per hour",
    "confirm_above": "with up: ask before renting above this many USD per hour (default $DTRAIN_CONFIRM_ABOVE, else 10); "
                     "without a terminal, refuse unless --yes",
    "hours": "with up: also show the price for this many hours",
    "idle_down": "with up: the nodes delete their own stack once no dtrain job has run for this many minutes "
                 "(data kept; the role may delete that stack and nothing else)",
})
def nodes(c, action, name=None, count=None, min_count=None, instance_type=None, spot=False, subnet=None,
          new_vpc=False, key_name=None, ssh_key=None, ssh_cidr=None, efs=False, lazy=True, address="auto", ssh_opt=None,
          region=None, profile=None, timeout="900", efa_interfaces=None, keep_on_failure=False, ssh_user=None,
          ami="auto", root_size=None, s3_bucket=None, s3_write=False, instance_profile=None, delete_data=False,
          all_regions=False, yes=False, confirm_above=None, hours=None, idle_down=None):
    """EC2 nodes from one CloudFormation stack: dtrain nodes up --name C --count 4 --instance-type T | down | list."""
    from dtrain.launch.errors import LaunchError
    from dtrain.launch.infra import ec2

    from dtrain import values

    with user_errors():
        _choice_flag("action", action, ("up", "down", "list", "sync"))
        if name is not None:
            values.name("--name", name)
        count = values.count("--count", count, 1, 10000) if count is not None else None
        min_count = values.count("--min-count", min_count, 1, 10000) if min_count is not None else None
        seconds = values.number("--timeout", timeout, 0, hi=86400)
        ssh_cidr = values.cidr("--ssh-cidr", ssh_cidr) if ssh_cidr is not None else None
        _choice_flag("--address", address, ("auto", "private", "public"))
        if instance_type is not None:
            values.instance_type("--instance-type", instance_type)
        if ssh_user is not None:
            values.user("--ssh-user", ssh_user)
        if ssh_key is not None:
            values.ssh_key("--ssh-key", ssh_key)
        from dtrain.launch.infra import fleet, pricing

        above = pricing.threshold(confirm_above) if action == "up" else 0.0
        hours = values.number("--hours", hours, 0) if hours is not None else None
        idle_down = values.count("--idle-down", idle_down, 1, ec2.IDLE_DOWN_MAX_MINUTES) if idle_down is not None else None
        if action == "list":
            for line in fleet.list_lines(lambda r: _aws(profile, r), region, all_regions):
                print(line)
            return
        if not name:
            raise LaunchError(f"nodes {action}: --name is required")
        if action == "down":
            if fleet.down_named(lambda r: _aws(profile, r), region, name, delete_data):
                sys.exit(1)  # something stays billed: said, line by line
            return
        if action == "sync":
            _nodes_sync(name, profile, region, ssh_opt)
            return
        session = _aws(profile, region)
        if not count or not instance_type:
            raise LaunchError("nodes up: --count and --instance-type are required")
        buckets = tuple(b.removeprefix("s3://").rstrip("/") for b in (s3_bucket or []))
        spec = ec2.NodesSpec(name=name, count=count, instance_type=instance_type, ssh_cidr=ssh_cidr,
                             min_count=min_count, spot=spot, subnet=subnet,
                             new_vpc=new_vpc, key_name=key_name, efs=efs, lazy=lazy,
                             efa_interfaces=_int_flag("--efa-interfaces", efa_interfaces, 1, 64)
                             if efa_interfaces is not None else None,
                             ssh_user=ssh_user, ami=ami,
                             root_size=_int_flag("--root-size", root_size, 8, 16384) if root_size is not None else None,
                             s3_buckets=buckets, s3_write=s3_write, instance_profile=instance_profile,
                             idle_down=idle_down)
        ssh_opts = _ssh_opts(ssh_opt)
        gate = pricing.nodes_up_gate(session, instance_type=instance_type, count=count, spot=spot, above=above,
                                     yes=yes, hours=hours)
        res = ec2.start(session, spec, address=address, here=ec2.vantage, confirm=gate)
        hint = (f"the security group lets ssh in from {res.ssh_rule} only; check that this machine's ssh "
                f"comes from there and can route to the nodes' {res.address} addresses")
        ready = ec2.ssh_ready(ssh_key, res.address, ssh_opts, timeout=seconds, user=res.ssh_user,
                              first_timeout=min(300.0, seconds), hint=hint)
        cluster, hostfile = ec2.finish(session, spec, res, identity=ssh_key, timeout=seconds, ready=ready,
                                       keep_on_failure=keep_on_failure, ssh_opts=ssh_opts)
        print(f"{len(cluster.instances)} nodes up ({res.address} addresses, user {res.ssh_user}); hostfile: {hostfile}")
        from dtrain.launch.infra import volume as vol
        from dtrain.launch.remote.hosts import parse_hostfile

        up_nodes = parse_hostfile(hostfile)
        ec2.write_worker_list(up_nodes, cluster, ssh_opts)
        print(f"worker list on every node: ~/.dtrain/{ec2.WORKER_LIST} (private addresses, one per line)")
        vol.reattach(session, cluster, up_nodes, ssh_opts=ssh_opts)
        print(f"launch with: dtrain launch --cluster {name} --image IMAGE -- CMD")


def _nodes_sync(name, profile, region, ssh_opt):
    """`nodes sync --name C`: the record and hostfile follow the group (ec2.follow_group), then the
    worker list on every node, as `nodes up` writes it."""
    from dtrain.launch.infra import ec2, regions
    from dtrain.launch.remote.hosts import parse_hostfile

    record = ec2.load_cluster(name)
    cluster, hostfile, changed = ec2.follow_group(_aws(profile, region or record.region or regions.default_region()),
                                                  name)
    if changed:
        ec2.write_worker_list(parse_hostfile(hostfile), cluster, _ssh_opts(ssh_opt, cluster=name))
        print(f"{len(cluster.instances)} nodes; hostfile: {hostfile}; worker list rewritten on every node")


@task(help={"refresh": "write both snapshots again from AWS with your credentials: DescribeInstanceTypes (the "
                       "region's) and the Pricing API (us-east-1, us-west-2, eu-west-1)",
            "region": "AWS region (prices shown for it; default us-east-1)", "profile": "AWS profile"})
def instance_types(c, refresh=False, region=None, profile=None):
    """EC2's data on the types dtrain knows (GPUs, EFA, vCPUs, memory, spot, price): dtrain instance-types [--refresh]."""
    from dtrain.launch.infra import pricing

    with user_errors():
        if refresh:
            pricing.refresh_all(_aws(profile, region))
            return
        print("\n".join(pricing.type_table(region or "us-east-1")))


@task(iterable=["ssh_opt"], help={
    "action": "create",
    "cluster": "a cluster made by `dtrain nodes up`",
    "size": "GiB (io2, 4 to 16384)", "from_snapshot": "snapshot id to make the volume from",
    "iops": "provisioned IOPS (default 3000)", "path": "mount path on every node (default /data)",
    "fill_from": "a directory on the first node copied onto a new volume before it goes read-only",
    "efs": "mount the cluster's EFS (nodes up --efs) read-write instead",
    "ssh_opt": NODE_HELP["ssh_opt"], "ssh_config": NODE_HELP["ssh_config"], "profile": "AWS profile",
})
def volume(c, action, cluster=None, size=None, from_snapshot=None, iops="3000", path="/data", fill_from=None,
           efs=False, ssh_opt=None, ssh_config=None, profile=None):
    """A dataset volume on every node of a cluster: io2 Multi-Attach, read-only (or EFS, read-write)."""
    from dtrain.launch.errors import LaunchError
    from dtrain.launch.infra import ec2, volume as vol

    with user_errors():
        if action != "create":
            raise LaunchError(f"unknown action {action!r}: use create")
        if not cluster:
            raise LaunchError("volume create: --cluster is required")
        from dtrain import values

        values.name("--cluster", cluster)
        ssh_opts = _ssh_opts(ssh_opt, ssh_config, cluster)
        spec = vol.VolumeSpec(cluster=cluster, size_gb=_int_flag("--size", size, 4, 16384) if size is not None else None,
                              snapshot=from_snapshot, iops=_int_flag("--iops", iops, 100, 256000), mount_path=path,
                              efs=efs, fill_from=fill_from)
        info = _cluster_record(cluster, profile)
        nodes = _nodes({"cluster": cluster})
        made = vol.create(_aws(profile, info.region), info, nodes, spec, ssh_opts=ssh_opts)
        mode = "read-write" if efs else "read-only"
        print(f"{made} mounted {mode} on {len(nodes)} nodes at {path}; "
              f"use it with: dtrain launch --cluster {cluster} --mount {path}:ro ...")


def _cluster_record(cluster, profile):
    """The cluster `nodes up` wrote here; where there is none, what its stack's state says
    (kept by --keep-on-failure, still being made, or none at all), asked read-only in the
    regions dtrain has used."""
    from dtrain.launch.errors import LaunchError
    from dtrain.launch.infra import ec2, fleet

    try:
        return ec2.load_cluster(cluster)
    except LaunchError as missing:
        raise (fleet.standing_stack(cluster, profile) or missing) from None


@task(iterable=["nic", "link_rate", "shared"], help={"action": "up, down or status", "nodes": "number of nodes for `up` (default 2)",
            "recreate": "with up: replace a cluster of another size",
            "link_rate": "with up: limit each node's link both ways, e.g. 1gbit; INDEX=RATE for one node, "
                         "e.g. 1gbit,3=100mbit (repeatable; default: no limit)",
            "nic": "with up: INDEX=NAME names node INDEX's NIC (default ens5), e.g. 2=eth0 (repeatable)",
            "shared": "with up: HOST_DIR:PATH mounts this machine's HOST_DIR at PATH (an existing directory "
                      "here) on every node, one directory for all, as EFS or NFS (repeatable); a job's "
                      "--mount PATH then shares it, e.g. Ray Train's storage",
            "lazy": "with up: insist on lazy nodes (SOCI snapshotter, Docker 26 on the containerd store; the registry "
                    "gets TLS): the default where the host can, else one line says why",
            "no_lazy": "with up: classic nodes (full pulls), plain-HTTP registry",
            "lazy_root": "with up: where Debian 13's soci-snapshotter, containerd, docker.io are unpacked "
                         "(default $DTRAIN_LAZY_ROOT, then /var/tmp/dtrain-lazy/root)"})
def cluster(c, action, nodes="2", recreate=False, nic=None, link_rate=None, lazy=False, lazy_root=None,
            shared=None, no_lazy=False):
    """Local simulated cluster (root, Linux): dtrain cluster up --nodes 3 | down | status."""
    from dtrain.launch import targets
    from dtrain.launch.infra import cluster as cl

    with user_errors():
        _choice_flag("action", action, ("up", "down", "status"))
        count = _int_flag("--nodes", nodes, 1, cl.MAX_NODES)
        from dtrain import values

        every, per_node = values.link_rates("--link-rate", link_rate, count)
        mode = cl.lazy_mode(action, lazy, no_lazy, lazy_root, recreate)  # issue 52: lazy by default
        if action == "up":
            names = {}
            for kv in nic or []:
                i, sep, name = kv.partition("=")
                if not sep or not i.isdigit():
                    raise cl.ClusterError(f"--nic {kv}: expected INDEX=NAME, e.g. 2=eth0")
                names[int(i)] = name
            local = targets.provider("local")  # launch/targets/local.py: launch/infra/cluster.py's up
            info = local.up(count, recreate=recreate, nic_names=names, link_rate=every, node_link_rates=per_node,
                            lazy=mode, shared=cl.parse_shared("--shared", shared))
            print(f"hostfile:   {info.hostfile}\nssh config: {info.ssh_config}\nregistry:   {info.registry}")
            for path, src in info.shared:
                print(f"shared:     {src} at {path} on every node (a job shares it with --mount {path})")
            if info.lazy:
                print(f"lazy:       nodes load SOCI-indexed images lazily; the registry speaks TLS "
                      f"({info.registry_ca}): dtrain push --registry {info.registry} adds the index")
            print(f"launch with: dtrain launch --hostfile {info.hostfile} --ssh-config {info.ssh_config} "
                  f"--image {info.registry}/dtrain/FAMILY:TAG -- CMD")
        elif action == "down":
            targets.provider("local").down()
        elif action == "status":
            st = cl.status()
            print("up" if st.up else "down", f"({st.nodes} nodes)")
            for problem in st.problems + st.leftovers:
                print(f"  {problem}")
        else:
            raise cl.ClusterError(f"unknown action {action!r}: use up, down or status")


@task(help={"nodes": "nodes in the simulated cluster (default 2)", "keep": "leave the cluster up",
            "epochs": "training epochs (default 3)"})
def demo(c, nodes="2", keep=False, epochs="3"):
    """The main job end to end: build the CPU Horovod image, simulated cluster, real training, teardown."""
    from dtrain.launch import demo as d

    with user_errors():
        sys.exit(d.run(_int_flag("--nodes", nodes, 1, 64), keep, _int_flag("--epochs", epochs, 1)))

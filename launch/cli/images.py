"""`dtrain render`, `build`, `push`: the images' tasks (the work: images/).

Each task is declared here, beside its body: tasks.py names them for Invoke."""

from __future__ import annotations

import sys

from dtrain.launch.cli_support import task, user_errors, _image_flag, _family_flag  # noqa: F401


@task(help={"image": "one family (horovod-tensorflow, horovod-pytorch, pytorch-ddp); default all",
            "check": "do not write; fail if dockerfiles/ differs from the specs"})
def render(c, image=None, check=False):
    """Validate images/*.yaml against compat.yaml and write dockerfiles/<family>/<tag>/Dockerfile."""
    from dtrain.images import render as r

    with user_errors():
        _family_flag(image)
        families = [image] if image else None
        if check:
            stale = [p for p, text in r.render_all(families).items()
                     if not p.exists() or p.read_text() != text]
            for p in stale:
                print(f"out of date: {p.relative_to(r.ROOT)}", file=sys.stderr)
            if stale:
                sys.exit("error: dockerfiles/ is out of date; run `dtrain render`")
            print("dockerfiles/ matches images/*.yaml")
            return
        changed, removed = r.write_all(families)
        for p in changed:
            print(f"wrote   {p.relative_to(r.ROOT)}")
        for p in removed:
            print(f"removed {p.relative_to(r.ROOT)}")
        print(f"{len(changed)} written, {len(removed)} removed, all others unchanged")


@task(help={
    "image": "one family; default all three",
    "tag": "one variant by tag (see dockerfiles/<family>/)",
    "all": "every variant, GPU ones too (needs the nvidia/cuda bases); default: CPU variants",
    "wheels": "the GPU variants whose CUDA comes from PyPI's wheels (no nvidia/cuda base needed)",
    "base_image": "base for both stages, e.g. a mirrored or imported image (dtrain/debian:bookworm)",
    "builder_image": "base for the builder stage only",
    "ca_bundle": "CA bundle for pip/curl/apt inside the build, as a BuildKit secret "
                 "(default: the host pip's, from PIP_CERT)",
    "pip_conf": "pip.conf for the build (private index), as a BuildKit secret",
    "wheelhouse": "directory of wheels offered to pip first (offline builds)",
    "push_cache": "registry repository to pull and push inline build cache",
    "no_cache": "ignore the layer cache",
    "project": "a project directory: build FROM a family image with its requirements.txt and code "
               "(docs/images.md)",
    "from_": "with --project: FAMILY or FAMILY:TAG to build from (default: `from:` in DIR/dtrain.yaml)",
})
def build(c, image=None, tag=None, all=False, base_image=None, builder_image=None, ca_bundle=None,
          pip_conf=None, wheelhouse=None, push_cache=None, no_cache=False, project=None, from_=None,
          wheels=False):
    """Build images with BuildKit from dockerfiles/ (run `dtrain render` first), or a project image."""
    from pathlib import Path

    from dtrain import engine, values
    from dtrain.images import build as b

    with user_errors():
        _family_flag(image)
        if tag is not None:
            from dtrain.reference import check_tag

            check_tag(tag, "--tag")
        _family_flag(from_, "--from", tag_ok=True)
        for flag, ref in (("--base-image", base_image), ("--builder-image", builder_image)):
            _image_flag(ref, flag)
        if push_cache is not None:
            from dtrain.reference import check_repository

            check_repository(push_cache, "--push-cache")
        if project or from_:
            from dtrain.images import project as pj

            if not project:
                raise b.BuildError("--from goes with --project DIR")
            opts = b.BuildOptions(ca_bundle=Path(ca_bundle) if ca_bundle else b.default_ca_bundle(),
                                  pip_conf=Path(pip_conf) if pip_conf else None, no_cache=no_cache,
                                  wheelhouse=Path(wheelhouse) if wheelhouse else None)
            checked = pj.check(Path(project), from_, opts)  # every flag before the engine starts
            engine.ensure_dockerd()
            pj.build(Path(project), from_, opts, checked=checked)
            return
        opts = b.BuildOptions(
            base_image=base_image, builder_image=builder_image,
            ca_bundle=Path(ca_bundle) if ca_bundle else b.default_ca_bundle(),
            pip_conf=Path(pip_conf) if pip_conf else None,
            wheelhouse=Path(wheelhouse) if wheelhouse else None,
            push_cache=push_cache, no_cache=no_cache)
        b.check([image] if image else None, tag, all, opts, wheels=wheels)  # every flag before the engine starts
        engine.ensure_dockerd()
        b.build([image] if image else None, tag, all, opts, wheels=wheels)


@task(help={
    "ecr": "push to Amazon ECR (repositories created with scan-on-push)",
    "registry": "push to this v2 registry HOST[:PORT]",
    "image": "FAMILY or FAMILY:TAG; default every built image",
    "account": "ECR registry account id (default: the caller's)",
    "region": "AWS region", "profile": "AWS profile",
    "repo_prefix": "repository prefix (default dtrain)",
    "immutable": "ECR: immutable tags", "lifecycle_policy": "ECR lifecycle policy JSON file",
    "user": "registry user", "password": "'-': the registry password from stdin (default $DTRAIN_REGISTRY_PASSWORD); a value is refused",
    "catalog": "catalog path (default build/catalog.json)",
    "soci": "insist on each image's SOCI index beside it (lazy loading): by default it is made where it can be "
            "(root, soci, a registry with TLS), else one line says why",
    "no_soci": "push no SOCI index", "soci_bin": "directory with soci, ctr, containerd (default $DTRAIN_SOCI_BIN, then PATH)",
    "containerd_socket": "the machine's containerd socket for the SOCI index (default: a private containerd, as root)",
})
def push(c, ecr=False, registry=None, image=None, account=None, region=None, profile=None,
         repo_prefix="dtrain", immutable=False, lifecycle_policy=None, user=None, password=None,
         catalog=None, soci=False, no_soci=False, soci_bin=None, containerd_socket=None):
    """Push built images to ECR or a registry, verify the digest by pulling it back, record it in the catalog."""
    from pathlib import Path

    from dtrain.images import push as p

    import re

    from dtrain import values

    with user_errors():
        _family_flag(image, tag_ok=True)
        if registry is not None:
            from dtrain.reference import check_registry

            check_registry(registry, "--registry")
        from dtrain.reference import check_path

        check_path(repo_prefix, "--repo-prefix")
        if account is not None and not re.fullmatch(r"[0-9]{12}", account, re.ASCII):
            raise values.BadValue(f"--account {values.shown(account)}: expected a 12-digit AWS account id")
        password = p.password_from_flag(password)  # never a value in argv: '-' (stdin) or the env
        if ecr == bool(registry):
            raise p.PushError("pass exactly one of --ecr or --registry HOST[:PORT]")
        from dtrain.images import soci as s

        from dtrain.launch.infra import cluster as cl

        lazy = s.from_flags(soci, no_soci, soci_bin, containerd_socket, registry,  # issue 52: by default
                            cluster=(cl.REGISTRY, cl.STATE_DIR / "registry" / "ca-bundle.pem"))
        images, notes = p.select_images(image)
        for n in notes:
            print(n)
        path = Path(catalog) if catalog else p.CATALOG
        if ecr:
            p.push_ecr(images, profile=profile, region=region, account=account, prefix=repo_prefix,
                       immutable=immutable, lifecycle_policy=lifecycle_policy, catalog_path=path, soci=lazy)
        else:
            p.push_registry(images, registry, user=user, password=password, prefix=repo_prefix,
                            catalog_path=path, soci=lazy)

"""Registry login for the nodes' pull: an ECR token fetched here with boto3, handed to
`docker login` on each node on stdin (never argv, never printed), into a per-launch Docker
config directory that the node removes after the pull (launch/node/host/login.sh). Only nodes the
user chose get it: hosts a job file names are known or confirmed before the first ssh
(launch/jobs/trust.py `check_hosts`), and a refused launch never fetches it."""

from __future__ import annotations

from dataclasses import dataclass

from dtrain import ecr
from dtrain.launch.errors import LaunchError


@dataclass(frozen=True)
class Login:
    registry: str = ""  # "" : no login
    user: str = ""
    password: str | None = None

    @property
    def args(self) -> list[str]:
        """The node program's REGISTRY USER arguments."""
        return [self.registry, self.user]

    @property
    def stdin(self) -> str:
        """What the node program reads first from its standard input."""
        return "" if self.password is None else self.password + "\n"


def login_for(image: str) -> Login:
    """For an ECR image, a login (boto3's credentials); for any other image, none."""
    m = ecr.REGISTRY_RE.match(image)
    if not m:
        return Login()
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError

        client = boto3.client("ecr", region_name=m.group(2))
        data = client.get_authorization_token(registryIds=[m.group(1)])["authorizationData"][0]
        user, password = ecr.decode_token(data["authorizationToken"])
    except (BotoCoreError, ClientError, ValueError) as e:
        raise LaunchError(f"ECR login for {image} failed: {e}") from None
    return Login(image.split("/", 1)[0], user, password)

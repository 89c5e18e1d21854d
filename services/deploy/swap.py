"""Replace one region's scheduler container in a running compose deployment.

Rules / theory of operation
---------------------------
* ``geoserve swap-scheduler --region R --image I [--policy P]`` works between runs on a
  deployment started with ``docker compose up`` (Compose v1 or v2): it finds the container
  of service ``scheduler-<R>`` by the compose labels of the project, and replaces it with
  one from image I that keeps everything compose gave the old one — command, the
  environment compose set (the old image's own defaults are left to the new image), mounts
  and host settings, labels (so ``docker compose down`` removes it), network and DNS
  aliases (the peers, the provisioner and the load generator keep reaching
  ``scheduler-<R>``), health check — except the image and, when given, the policy
  (``GEOSERVE_POLICY`` / ``GEOSERVE_POLICY_CONFIG``).
* Order: the old container is stopped and renamed aside; the new one is created under the
  old name, started and waited for until its health check says healthy. Then the old one
  is removed. If the new one exits or stays unhealthy, it is removed and the old one is
  renamed back and restarted (rollback), and the command fails naming the reason.
* Argument checks come first and need no Docker engine: the region must be one of the
  compose file's ``scheduler-*`` services (the error names the region and the known
  ones), the policy one of the registry's (unless ``--any-policy``, for images that bring
  their own policies).
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from services.deploy.compose import scheduler_service
from services.model.errors import InvalidInput, Unavailable

PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"


@dataclass(frozen=True)
class SwapRequest:
    project: str
    region: str
    service: str
    image: str
    policy: str | None = None
    policy_config: str | None = None
    health_cmd: str | None = None
    timeout_s: float = 120.0


def project_name(compose_file: Path, explicit: str | None = None) -> str:
    """Compose's project name: explicit, else the compose file's folder, normalised."""
    raw = explicit if explicit else compose_file.resolve().parent.name
    name = re.sub(r"[^a-z0-9_-]", "", raw.lower())
    if not name:
        raise InvalidInput("--project", f"{raw!r} gives an empty compose project name")
    return name


def compose_regions(compose_file: Path) -> list[str]:
    """Regions with a ``scheduler-<region>`` service in a compose file."""
    try:
        data = yaml.safe_load(compose_file.read_text())
    except OSError as exc:
        raise InvalidInput("--file", f"cannot read compose file {compose_file}: "
                                     f"{exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise InvalidInput("--file", f"{compose_file} is not valid YAML: {exc}") from exc
    services = data.get("services") if isinstance(data, dict) else None
    if not isinstance(services, dict):
        raise InvalidInput("--file", f"{compose_file} has no services")
    prefix = scheduler_service("")
    return [name[len(prefix):] for name in services if str(name).startswith(prefix)]


def validate(
    *,
    compose_file: Path,
    region: str,
    image: str,
    project: str | None = None,
    policy: str | None = None,
    policy_config: str | None = None,
    any_policy: bool = False,
    health_cmd: str | None = None,
    timeout_s: float = 120.0,
    known_policies: Callable[[], Sequence[str]] | None = None,
) -> SwapRequest:
    """Check the arguments of a swap; raises `InvalidInput` naming the bad one."""
    regions = compose_regions(compose_file)
    if region not in regions:
        raise InvalidInput(
            "--region",
            f"unknown region {region!r}: {compose_file} has no service "
            f"{scheduler_service(region)!r}; known regions: {', '.join(regions) or 'none'}")
    if not image or any(c.isspace() for c in image):
        raise InvalidInput("--image", f"expected an image reference, got {image!r}")
    if policy is not None and not any_policy:
        if known_policies is None:
            from services.scheduler.policies.registry import available

            known_policies = available
        names = list(known_policies())
        if policy not in names:
            raise InvalidInput(
                "--policy", f"unknown policy {policy!r}; known: {', '.join(names)} "
                "(--any-policy passes it on unchecked, for an image with its own policies)")
    if policy_config:
        for part in (p.strip() for p in policy_config.split(",")):
            if part and "=" not in part:
                raise InvalidInput("--policy-config",
                                   f"expected key=value entries, got {part!r}")
    if not timeout_s > 0:
        raise InvalidInput("--timeout", f"must be > 0, got {timeout_s}")
    return SwapRequest(
        project=project_name(compose_file, project),
        region=region,
        service=scheduler_service(region),
        image=image,
        policy=policy,
        policy_config=policy_config,
        health_cmd=health_cmd,
        timeout_s=timeout_s,
    )


def _set_env(env: list[str], key: str, value: str) -> list[str]:
    out = [e for e in env if e.split("=", 1)[0] != key]
    out.append(f"{key}={value}")
    return out


def _own(value: Any, image_value: Any) -> Any:
    """A container setting compose gave, or None when it is just the image's default."""
    return None if value == image_value else value


def swap_scheduler(req: SwapRequest, client: Any | None = None,
                   log: Callable[[str], None] = print) -> str:
    """Do the swap (see the module doc); returns the new container's id."""
    with warnings.catch_warnings():
        # the docker SDK and its dependencies may warn about deprecations on import/use
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import docker
            from docker.errors import DockerException, ImageNotFound, NotFound
        except ImportError as exc:
            raise Unavailable("geoserve swap-scheduler needs the docker package: "
                             "pip install 'geoserve[deploy]'") from exc

        try:
            client = client or docker.from_env()
            client.ping()
        except DockerException as exc:
            raise Unavailable(f"cannot reach the Docker engine: {exc}") from exc
        return _swap(req, client, log, ImageNotFound, NotFound)


def _swap(req: SwapRequest, client: Any, log: Callable[[str], None],
          image_not_found: type[Exception], not_found: type[Exception]) -> str:
    api = client.api
    filters = {"label": [f"{PROJECT_LABEL}={req.project}", f"{SERVICE_LABEL}={req.service}"]}
    found = api.containers(all=True, filters=filters)
    if not found:
        raise Unavailable(
            f"no container of service {req.service!r} in compose project {req.project!r}; "
            f"start the deployment first (docker compose -p {req.project} up -d) or pass "
            "--project")
    if len(found) > 1:
        raise Unavailable(f"{len(found)} containers of {req.service!r} in project "
                          f"{req.project!r}; scale it to one before swapping")
    old = api.inspect_container(found[0]["Id"])
    try:
        api.inspect_image(req.image)
    except image_not_found:
        log(f"swap-scheduler: pulling {req.image}")
        try:
            client.images.pull(req.image)
        except Exception as exc:
            raise Unavailable(f"image {req.image!r} is neither here nor pullable: {exc}") from exc
    try:
        old_image_cfg: Mapping[str, Any] = api.inspect_image(old["Image"])["Config"] or {}
    except not_found:
        old_image_cfg = {}

    cfg = old["Config"]
    image_env = set(old_image_cfg.get("Env") or [])
    env = [e for e in (cfg.get("Env") or []) if e not in image_env]
    if req.policy is not None:
        env = _set_env(env, "GEOSERVE_POLICY", req.policy)
    if req.policy_config is not None:
        env = _set_env(env, "GEOSERVE_POLICY_CONFIG", req.policy_config)
    image_labels = old_image_cfg.get("Labels") or {}
    labels = {k: v for k, v in (cfg.get("Labels") or {}).items()
              if image_labels.get(k) != v}
    if "com.docker.compose.image" in labels:  # Compose v2 records the image id there
        labels["com.docker.compose.image"] = api.inspect_image(req.image)["Id"]
    healthcheck = cfg.get("Healthcheck")
    if req.health_cmd:
        healthcheck = {**(healthcheck or {}), "Test": ["CMD-SHELL", req.health_cmd]}
    name = old["Name"].lstrip("/")
    networks: Mapping[str, Any] = old["NetworkSettings"].get("Networks") or {}
    short_id = old["Id"][:12]
    endpoints = {
        net: [a for a in (ep.get("Aliases") or []) if a not in (short_id, old["Id"])]
        for net, ep in networks.items()
    }
    for aliases in endpoints.values():
        if req.service not in aliases:
            aliases.append(req.service)
    host_config = dict(old["HostConfig"])
    first_net = host_config.get("NetworkMode") or next(iter(endpoints), None)
    stop_timeout = cfg.get("StopTimeout") or 15

    aside = f"{name}-replaced-{int(time.time())}"
    log(f"swap-scheduler: stopping {name} ({old['Config']['Image']})")
    api.stop(old["Id"], timeout=stop_timeout)
    api.rename(old["Id"], aside)
    new_id = ""
    try:
        net_cfg = None
        if first_net in endpoints:
            net_cfg = api.create_networking_config(
                {first_net: api.create_endpoint_config(aliases=endpoints[first_net])})
        created = api.create_container(
            req.image,
            command=cfg.get("Cmd"),
            entrypoint=_own(cfg.get("Entrypoint"), old_image_cfg.get("Entrypoint")),
            user=_own(cfg.get("User"), old_image_cfg.get("User")) or None,
            working_dir=_own(cfg.get("WorkingDir"), old_image_cfg.get("WorkingDir")) or None,
            environment=env,
            labels=labels,
            name=name,
            hostname=None,
            host_config=host_config,
            networking_config=net_cfg,
            healthcheck=healthcheck,
            stop_signal=cfg.get("StopSignal"),
            stop_timeout=cfg.get("StopTimeout"),
        )
        new_id = created["Id"]
        for net, aliases in endpoints.items():
            if net != first_net:
                api.connect_container_to_network(new_id, net, aliases=aliases)
        api.start(new_id)
        log(f"swap-scheduler: started {name} from {req.image}; waiting for it to be healthy")
        _wait_healthy(api, new_id, name, req.timeout_s)
    except Exception:
        log(f"swap-scheduler: {name} did not come up; restoring the previous container")
        if new_id:
            try:
                api.remove_container(new_id, force=True)
            except Exception as exc:  # keep the first error; say what was left
                log(f"swap-scheduler: could not remove the new container: {exc}")
        api.rename(old["Id"], name)
        api.start(old["Id"])
        raise
    api.remove_container(old["Id"], v=False)
    log(f"swap-scheduler: {req.service} now runs {req.image}"
        + (f" with policy {req.policy}" if req.policy else ""))
    return str(new_id)


def _wait_healthy(api: Any, cid: str, name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    status = "starting"
    while time.monotonic() < deadline:
        state = api.inspect_container(cid)["State"]
        if state.get("Status") in ("exited", "dead"):
            tail = api.logs(cid, tail=30).decode(errors="replace")
            raise Unavailable(f"{name} exited with {state.get('ExitCode')}:\n{tail}")
        health = state.get("Health")
        if health is None:  # no health check: running is all we can know
            if state.get("Running"):
                return
        else:
            status = health.get("Status", "")
            if status == "healthy":
                return
            if status == "unhealthy":
                last = (health.get("Log") or [{}])[-1].get("Output", "")
                raise Unavailable(f"{name} is unhealthy: {last.strip()}")
        time.sleep(0.5)
    raise Unavailable(f"{name} not healthy after {timeout_s:.0f} s (last status {status})")

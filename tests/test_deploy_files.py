"""The deploy files (Dockerfile, compose.yaml, deploy/kubernetes/, deploy/systemd/) keep the promises SPEC §17 and
docs/operations.md make, and agree with each other and with the bot's settings.

Read as data only, no container runtime or cluster: the schemas they must also satisfy are checked by
.ci/deploy-checks (compose-spec, Kubernetes, systemd-analyze), the install steps by running them there.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
KUBERNETES = ROOT / "deploy" / "kubernetes"
DRAIN_S = float(Settings.model_fields["shutdown_drain_s"].default)


# -- Dockerfile -------------------------------------------------------------------------------------


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuation lines joined, comments left out."""
    joined: list[str] = []
    pending = ""
    for line in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    return [(parts[0].upper(), parts[1].strip() if len(parts) > 1 else "")
            for parts in (text.strip().split(None, 1) for text in joined)]


def final_stage() -> list[tuple[str, str]]:
    found = instructions()
    last_from = max(i for i, (keyword, _) in enumerate(found) if keyword == "FROM")
    return found[last_from:]


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in final_stage():
        if keyword == "ENV":
            env.update(item.split("=", 1) for item in shlex.split(args))
    return env


def image_uid() -> str:
    stage = final_stage()
    default = next(args.split("=", 1)[1] for keyword, args in stage
                   if keyword == "ARG" and args.startswith("BOT_UID="))
    user = next(args for keyword, args in stage if keyword == "USER")
    return user.replace("${BOT_UID}", default).split(":")[0]


def test_the_image_builds_from_a_base_given_as_an_argument_defaulting_to_the_slim_python():
    found = instructions()
    assert found[0] == ("ARG", "BASE_IMAGE=python:3.11-slim")
    stages = [args for keyword, args in found if keyword == "FROM"]
    assert len(stages) == 2 and all(stage.startswith("${BASE_IMAGE}") for stage in stages)


def test_the_image_installs_with_the_script_ci_runs_and_only_from_the_lock():
    runs = [args for keyword, args in instructions() if keyword == "RUN"]
    assert "sh deploy/container/install.sh deps /opt/venv" in runs
    assert "sh deploy/container/install.sh app /opt/venv" in runs
    script = (ROOT / "deploy" / "container" / "install.sh").read_text(encoding="utf-8")
    assert "--require-hashes -r requirements/run.txt" in script
    assert "wheel --quiet --no-deps --no-build-isolation --wheel-dir" in script  # tests/security/test_issue38_review.py
    ci = (ROOT / ".ci" / "deploy-checks").read_text(encoding="utf-8")
    assert "deploy/container/install.sh deps" in ci and "deploy/container/install.sh app" in ci


def test_the_image_runs_bot_run_as_a_fixed_non_root_user_with_bot_home_on_a_volume():
    stage = final_stage()
    keywords = dict(stage)
    assert image_uid().isdigit() and int(image_uid()) > 0
    assert image_env()["BOT_HOME"] == "/var/lib/bot"
    assert keywords["VOLUME"] == '["/var/lib/bot"]'
    assert keywords["ENTRYPOINT"] == '["tini", "--", "bot"]' and keywords["CMD"] == '["run"]'
    assert keywords["EXPOSE"] == image_env()["PORT"]
    assert any("apt-get install" in args and " bubblewrap " in args for keyword, args in stage if keyword == "RUN")
    assert keywords["HEALTHCHECK"].endswith('CMD ["python3", "/usr/local/lib/bot/healthcheck.py"]')
    assert "/healthz" in (ROOT / "deploy" / "container" / "healthcheck.py").read_text(encoding="utf-8")


def test_the_build_context_leaves_out_secrets_and_local_state():
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert "*" in ignored  # everything out (.env, BOT_HOME, venvs), then only what the build copies back in
    allowed = {line[1:].rstrip("/") for line in ignored if line.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "requirements", "core", "channels", "bot", "deploy/container"}


# -- compose.yaml -----------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text(encoding="utf-8"))
    return loaded


def test_compose_starts_postgres_healthy_then_migrates_then_the_bot():
    services = compose()["services"]
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert services["migrate"]["command"] == ["migrate"]
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["bot"]["depends_on"] == {"postgres": {"condition": "service_healthy"},
                                             "migrate": {"condition": "service_completed_successfully"}}
    assert services["bot"].get("command") is None  # the image's CMD: bot run


def test_compose_keeps_data_on_named_volumes_and_secrets_in_the_env_file():
    document = compose()
    services = document["services"]
    assert set(document["volumes"]) == {"pgdata", "bothome"}
    assert "pgdata:/var/lib/postgresql/data" in services["postgres"]["volumes"]
    assert f"bothome:{image_env()['BOT_HOME']}" in services["bot"]["volumes"]
    for name in ("bot", "migrate"):
        assert services[name]["env_file"] == [".env"]
        assert services[name]["environment"]["DATABASE_URL"].startswith("postgresql://bot:${POSTGRES_PASSWORD}@")
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    example = (ROOT / "deploy" / "compose.env.example").read_text(encoding="utf-8")
    assert re.search(r"^POSTGRES_PASSWORD=$", example, re.M) and re.search(r"^BOT_WEB_TOKEN=$", example, re.M)


def test_compose_waits_for_the_drain_before_killing_the_bot():
    grace = compose()["services"]["bot"]["stop_grace_period"]
    assert grace.endswith("s") and float(grace[:-1]) > DRAIN_S


# -- Kubernetes -------------------------------------------------------------------------------------


def manifests() -> Iterator[dict[str, Any]]:
    for path in sorted((KUBERNETES / "base").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            yield from yaml.safe_load_all(path.read_text(encoding="utf-8"))


def resource(kind: str) -> dict[str, Any]:
    return next(item for item in manifests() if item["kind"] == kind)


def test_the_deployment_probes_readiness_and_liveness_and_outlasts_the_drain():
    pod = resource("Deployment")["spec"]["template"]["spec"]
    (bot,) = pod["containers"]
    assert bot["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert bot["livenessProbe"]["httpGet"]["path"] == "/healthz"
    drain = next(float(env["value"]) for env in bot["env"] if env["name"] == "SHUTDOWN_DRAIN_S")
    assert pod["terminationGracePeriodSeconds"] > max(drain, DRAIN_S)
    assert bot["ports"] == [{"name": "http", "containerPort": int(image_env()["PORT"])}]


@pytest.mark.parametrize("kind", ["Deployment", "Job"])
def test_pods_run_non_root_read_only_without_capabilities(kind: str):
    pod = resource(kind)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert str(pod["securityContext"]["runAsUser"]) == image_uid()
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    mounted = {mount["mountPath"] for mount in container["volumeMounts"]}
    assert mounted == {image_env()["BOT_HOME"], "/tmp"}  # the only writable places on a read-only root


@pytest.mark.parametrize("kind", ["Deployment", "Job"])
def test_replicas_cannot_start_on_a_database_or_keys_of_their_own(kind: str):
    # Without DATABASE_URL each pod would silently use a SQLite file in its own emptyDir, and without
    # BOT_SECRET_KEYS seal credentials with a key no other replica has: a required secret key refuses to start.
    (container,) = resource(kind)["spec"]["template"]["spec"]["containers"]
    required = {env["name"] for env in container["env"] if "secretKeyRef" in env.get("valueFrom", {})
                and not env["valueFrom"]["secretKeyRef"].get("optional", False)}
    assert "DATABASE_URL" in required
    if kind == "Deployment":
        assert "BOT_SECRET_KEYS" in required


def test_the_migration_job_runs_bot_migrate_and_the_budget_keeps_a_replica():
    (container,) = resource("Job")["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["migrate"]
    deployment, budget = resource("Deployment"), resource("PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert budget["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    assert resource("Service")["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_kustomizations_name_existing_files_and_never_the_example_secret():
    for folder in (KUBERNETES, KUBERNETES / "base", KUBERNETES / "sandbox"):
        kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text(encoding="utf-8"))
        for entry in [*kustomization.get("resources", []), *(p["path"] for p in kustomization.get("patches", []))]:
            assert (folder / entry).exists(), f"{folder}: {entry}"
            assert "secret" not in entry


def test_the_example_secret_holds_placeholders_only():
    secret = yaml.safe_load((KUBERNETES / "secret.example.yaml").read_text(encoding="utf-8"))
    secrets = [key for key in secret["stringData"] if re.search("TOKEN|SECRET|KEY|PASSWORD|DATABASE_URL", key)]
    assert {"DATABASE_URL", "BOT_SECRET_KEYS", "BOT_WEB_TOKEN", "SLACK_BOT_TOKEN", "LLM_API_KEY"} <= set(secrets)
    for key in secrets:
        assert "CHANGE-ME" in secret["stringData"][key], key


def test_the_sandbox_overlay_allows_user_namespaces_inside_a_user_namespaced_pod():
    patch = yaml.safe_load((KUBERNETES / "sandbox" / "sandbox-patch.yaml").read_text(encoding="utf-8"))
    pod = patch["spec"]["template"]["spec"]
    assert pod["hostUsers"] is False  # root inside the pod is nobody on the node
    assert pod["securityContext"]["seccompProfile"] == {"type": "Unconfined"}
    assert pod["containers"][0]["securityContext"]["procMount"] == "Unmasked"


# -- systemd ----------------------------------------------------------------------------------------


def unit() -> dict[str, list[str]]:
    """deploy/systemd/bot.service as {Key: [values]} over all sections, comments left out."""
    settings: dict[str, list[str]] = {}
    for line in (ROOT / "deploy" / "systemd" / "bot.service").read_text(encoding="utf-8").splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_the_unit_keeps_bot_home_in_its_state_directory_and_restarts_on_failure():
    found = unit()
    assert found["StateDirectory"] == ["bot"] and "BOT_HOME=%S/bot" in found["Environment"]
    assert found["EnvironmentFile"] == ["/etc/bot/bot.env"]
    assert found["Restart"] == ["on-failure"]
    assert found["ExecStart"][0].endswith("/bin/bot run")
    assert found["User"] == ["bot"] and found["NoNewPrivileges"] == ["yes"]
    assert float(found["TimeoutStopSec"][0].rstrip("s")) > DRAIN_S and found["KillMode"] == ["mixed"]


def test_the_unit_sets_nothing_that_refuses_bubblewrap_its_namespaces_or_its_proc():
    # Each of these makes bubblewrap fail (docs/operations.md, "Deploying": reproduced with mounts and setpriv),
    # and the bot would then start without shell_run.
    breaking = {"RestrictNamespaces", "PrivateUsers", "ProtectKernelTunables", "ProtectKernelLogs", "ProcSubset",
                "ProtectHostname", "SystemCallFilter"}
    assert breaking.isdisjoint(unit())

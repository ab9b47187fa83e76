# The chat-ops gateway as a container image: `docker build -t chatops-gateway .`
# BASE_IMAGE: any Debian-based image with python3.11 and its venv module (default: the official slim one;
# a locally made base works too, e.g. where no registry is reachable: docs/operations.md, "Deploying").
ARG BASE_IMAGE=python:3.11-slim

# --- build: a venv holding exactly the lock file's packages, then this project without dependencies ---
FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1
WORKDIR /src
# The dependencies first, in a layer of their own: a change to the code alone reuses it.
COPY requirements/run.txt requirements/run.txt
COPY deploy/container/install.sh deploy/container/install.sh
RUN sh deploy/container/install.sh deps /opt/venv
COPY pyproject.toml README.md ./
COPY core core
COPY channels channels
COPY bot bot
# The build backend (setuptools, wheel) from its own lock, hashes checked: no unpinned download during the build.
COPY requirements/build.txt requirements/build.txt
RUN sh deploy/container/install.sh app /opt/venv

# --- run: the venv, bubblewrap for shell_run's sandbox, a non-root user -----------------------------
FROM ${BASE_IMAGE}
# bubblewrap: shell_run's sandbox (it still needs user namespaces from the runtime, see below);
# tini: PID 1 that forwards SIGTERM to the bot and reaps whatever its commands leave behind.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends bubblewrap tini \
 && rm -rf /var/lib/apt/lists/*
# A fixed uid/gid, so volumes, Kubernetes' runAsUser and file modes agree across rebuilds.
ARG BOT_UID=10001
RUN groupadd --gid "${BOT_UID}" bot \
 && useradd --no-log-init --uid "${BOT_UID}" --gid bot --home-dir /var/lib/bot --no-create-home \
      --shell /usr/sbin/nologin bot \
 && install -d -o bot -g bot -m 0700 /var/lib/bot
COPY --from=build /opt/venv /opt/venv
COPY deploy/container/healthcheck.py /usr/local/lib/bot/healthcheck.py
# HOST=0.0.0.0 so the published port reaches the bot; the bot then refuses to start with the web chat
# on and no BOT_WEB_TOKEN (set one, or BOT_WEB_CHAT=false).
ENV PATH=/opt/venv/bin:$PATH \
    BOT_HOME=/var/lib/bot \
    HOST=0.0.0.0 \
    PORT=3000 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# BOT_HOME: the SQLite database (when DATABASE_URL is not set), keys, agents' work folders.
VOLUME ["/var/lib/bot"]
WORKDIR /var/lib/bot
USER ${BOT_UID}:${BOT_UID}
EXPOSE 3000
# /healthz answers as soon as the port is bound (readiness is /readyz); startup recovery may take a while.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python3", "/usr/local/lib/bot/healthcheck.py"]
# Without user namespaces (Docker's default seccomp profile refuses them) bubblewrap cannot start, and the
# bot starts without shell_run and logs why; docs/operations.md says what the runtime must allow.
ENTRYPOINT ["tini", "--", "bot"]
CMD ["run"]

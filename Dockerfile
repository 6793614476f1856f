# `python -m outbox serve` as a container: the relay's functions in one process, wake-ups over
# PostgreSQL (no Azure Storage needed), /healthz, /readyz and /metrics. docs/self-hosting.md says
# how to run it (Azure Container Apps included); tests/acceptance/test_container_recipe.py runs
# these same install and start commands in a fresh environment (no image is built in CI).

FROM python:3.13-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY outbox ./outbox
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.13-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    OUTBOX_WAKEUP=postgres
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin outbox
COPY --from=build /wheels /wheels
# The relay with Entra sign-in (passwordless PostgreSQL) and /metrics' Prometheus exporter.
RUN pip install --no-cache-dir "$(ls /wheels/outbox_relay-*.whl)[azure,prometheus]" \
    && rm -rf /wheels
USER 10001
EXPOSE 7071
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7071/healthz', timeout=2)"]
# SIGTERM (docker stop, a new revision) lets the drains in progress finish their requests and
# record them, gives back what was leased and not sent, then exits 0.
STOPSIGNAL SIGTERM
CMD ["python", "-m", "outbox", "serve", "--host", "0.0.0.0", "--port", "7071"]

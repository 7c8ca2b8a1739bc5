# syntax=docker/dockerfile:1
# The rabbitflow gateway (and the admin/demo tools) as one image.
#
#   docker build -t rabbitflow .
#   docker run -p 5673:5673 rabbitflow --upstream amqp://guest:guest@rabbitmq-host:5672/%2F
#
# Two stages: the first builds the wheel, whose build compiles the gateway's
# hot path with mypyc (gcc and mypy live only there; without a compiler the
# build would make a pure-Python wheel and say so), plus the wheels of its
# dependencies; the second installs those wheels, not the sources, and runs
# as an unprivileged user.

FROM python:3.11-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY client ./client
COPY broker_plugin ./broker_plugin
COPY pipeline ./pipeline
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && pip wheel --no-cache-dir --wheel-dir /wheels "$(ls /wheels/rabbitflow-*.whl)[broker]"

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/rabbitflow --create-home rabbitflow \
 && mkdir -p /var/log/rabbitflow \
 && chown rabbitflow:rabbitflow /var/log/rabbitflow
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels "rabbitflow[broker]" \
 && python -c "import rabbitflow_broker.accel as a; print('engine:', a.status())"
# In a container the gateway serves every interface (the admin API stays on
# loopback unless --admin-listen and --admin-users say otherwise).
ENV RABBITFLOW_BROKER_LISTEN=0.0.0.0:5673
USER rabbitflow
WORKDIR /var/lib/rabbitflow
EXPOSE 5673 15673
HEALTHCHECK --interval=5s --timeout=5s --start-period=10s --retries=6 \
    CMD ["python", "-m", "rabbitflow_broker.server.healthcheck"]
ENTRYPOINT ["rabbitflow-broker"]

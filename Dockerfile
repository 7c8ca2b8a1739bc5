# The rabbitflow gateway (and the client/demo tools) as one image.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY client ./client
COPY broker_plugin ./broker_plugin
COPY pipeline ./pipeline
COPY scripts/build_accel.py ./scripts/
# Installed in place so that the connection engine can be compiled beside its
# sources with mypyc (gcc and mypy are needed for the build only); if the
# build failed the gateway would run the same engine as pure Python.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && pip install --no-cache-dir -e ".[broker]" mypy \
 && python scripts/build_accel.py \
 && python scripts/build_accel.py --check \
 && pip uninstall -y mypy \
 && apt-get purge -y gcc libc6-dev && apt-get autoremove -y \
 && rm -rf /var/lib/apt/lists/*
EXPOSE 5673 15673
ENTRYPOINT ["rabbitflow-broker"]

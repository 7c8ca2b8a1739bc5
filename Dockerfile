# The rabbitflow gateway (and the client/demo tools) as one image.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY client ./client
COPY broker_plugin ./broker_plugin
COPY pipeline ./pipeline
RUN pip install --no-cache-dir ".[broker]"
EXPOSE 5673 15673
ENTRYPOINT ["rabbitflow-broker"]

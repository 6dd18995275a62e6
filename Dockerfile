# One image for every Quartermaster process; docker-compose.yml picks the module per container.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY . .
RUN pip install .
# As services/demo/stack.py runs the services (PYTHONPATH=REPO): code, schemas/, policies/ and
# examples/ resolve from this checkout, for `python -m services.<x>` and the `qm` script alike.
ENV PYTHONPATH=/app

# Non-root. /config receives the demo's generated Kueue config; a named volume mounted there
# starts with this directory's owner, so the user can write it.
RUN useradd --system --uid 10001 --no-create-home qm && mkdir /config && chown qm /config
USER qm

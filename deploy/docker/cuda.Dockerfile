# asyncrl, CUDA image: on vLLM's own image (CUDA torch and vLLM 0.32.0 built for each other), plus this
# package. Rollout replicas, the teacher and the learner run on GPUs (engine vllm, weight transport nccl).
#   docker build -f deploy/docker/cuda.Dockerfile -t asyncrl:0.1.0-cuda .
FROM vllm/vllm-openai:v0.32.0

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto proto
COPY asyncrl asyncrl
COPY push push
COPY controller controller
COPY rollout rollout
COPY teacher teacher
COPY learner learner
COPY services services
COPY examples /opt/asyncrl/examples
# Keeps vLLM's torch (the base image's CUDA build satisfies torch>=2.4); the import check fails the build
# if the install replaced or broke it.
RUN python3 -m pip install --no-cache-dir . \
 && python3 -I -c "import torch, vllm, asyncrl.services.rollout_service, asyncrl.learner.loop; assert torch.version.cuda" \
 && rm -rf /src

# /models and /runs exist and belong to the user, so a fresh named volume mounted there (compose) is
# writable by it; Kubernetes pods get the same through fsGroup.
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/asyncrl asyncrl \
 && mkdir -p /models /runs && chown asyncrl:asyncrl /models /runs
USER 10001:10001
WORKDIR /home/asyncrl
ENV HOME=/home/asyncrl MPLCONFIGDIR=/tmp/matplotlib

HEALTHCHECK --interval=15s --timeout=10s --start-period=300s --retries=3 CMD ["asyncrl", "health"]
ENTRYPOINT ["asyncrl"]

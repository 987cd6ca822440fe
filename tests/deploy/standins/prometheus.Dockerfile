# Stand-in for prom/prometheus:v2.55.1, built only where no image registry answers (tests/deploy): Debian
# bookworm's Prometheus (2.42), with the real image's entrypoint, user and data folder.
FROM asyncrl-standin/debian:bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /prometheus /etc/prometheus && chown nobody:nogroup /prometheus
LABEL org.asyncrl.standin="prom/prometheus:v2.55.1"
USER nobody
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]

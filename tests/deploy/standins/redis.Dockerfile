# Stand-in for redis:7.4, built only where no image registry answers (tests/deploy): Debian bookworm's Redis
# (7.0) with redis-cli, running as the `redis` user in /data like the real image.
FROM asyncrl-standin/debian:bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data && chown redis:redis /data
LABEL org.asyncrl.standin="redis:7.4"
USER redis
WORKDIR /data
EXPOSE 6379
CMD ["redis-server"]

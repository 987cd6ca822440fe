# Stand-in for python:3.11-slim-bookworm, built only where no image registry answers (tests/deploy): Debian
# bookworm's own Python 3.11 on a debootstrap root, with `python` and `pip` on PATH and pip free to install into
# the system interpreter, as in the real image. local-ca/ holds the certificate authorities this machine added
# to its own trust (/usr/local/share/ca-certificates, often empty): where a proxy re-signs the package
# registries' TLS, pip in the image must trust what the machine trusts.
FROM asyncrl-standin/debian:bookworm
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY local-ca/ /usr/local/share/ca-certificates/
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip python-is-python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* /usr/lib/python3.11/EXTERNALLY-MANAGED \
 && update-ca-certificates \
 && ln -s /usr/bin/pip3 /usr/local/bin/pip
LABEL org.asyncrl.standin="python:3.11-slim-bookworm"
CMD ["python3"]

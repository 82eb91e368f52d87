# nimbus in a container: the `nimbus` CLI and node daemon, the example
# programs, and the libtorch (with NCCL) of the torch release they were
# built against.
#
#   make image                      # docker build -t nimbus .
#   docker run --rm --network host --shm-size=8g nimbus start --head --port 6379 --block
#   docker run --rm --network host --shm-size=8g --gpus all -e NIMBUS_TOKEN=... \
#       nimbus start --address HEAD:6379 --block
#
# nimbus talks QUIC, which is UDP (unlike Ray's TCP 6379): with
# `--network host` nothing needs mapping; otherwise publish the head's port
# as UDP (`-p 6379:6379/udp`), give members a fixed `--port`, and note that
# every worker process listens on a UDP port of its own. `/dev/shm` holds
# the object store and the training collective: size it (`--shm-size`).
# README.md, "Container image", says more.

# Build: the same steps as `make build`, then the runtime layout.
FROM rust:1.85-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-venv g++ \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN make build && scripts/image-runtime.sh /opt/nimbus target/release

# Run: Debian with the layout, as a user of its own (not root).
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 nimbus
COPY --from=build /opt/nimbus /opt/nimbus
ENV PATH=/opt/nimbus/bin:$PATH \
    LD_LIBRARY_PATH=/opt/nimbus/lib \
    NIMBUS_HOME=/home/nimbus/.nimbus
# The layout was checked in the build stage; check it again here, where
# only this image's system libraries are.
RUN for program in /opt/nimbus/bin/*; do \
      if ldd "$program" | grep "not found"; then \
        echo "$program cannot load the libraries above in this image" >&2; exit 1; \
      fi; \
    done
USER nimbus
WORKDIR /home/nimbus
ENTRYPOINT ["nimbus"]
CMD ["start", "--head", "--block"]

# leasehold in a container, built FROM scratch: no base image is pulled. The binary is
# built first on the host, static and without cgo (`make image` does both steps):
#   CGO_ENABLED=0 go build -trimpath -o bin/leasehold ./cmd/leasehold
# Ports: 7740 API (Connect), 7741 raft (between nodes), 7742 fast lane (clients). A node
# bound to 0.0.0.0 must be told how others reach it: --advertise-addr, --raft-advertise
# and --fast-lane-advertise (see compose.yaml and docs/OPERATIONS.md).
FROM scratch
COPY bin/leasehold /leasehold
VOLUME /data
EXPOSE 7740 7741 7742
ENTRYPOINT ["/leasehold"]
CMD ["server", "--data-dir", "/data", "--addr", "0.0.0.0:7740", "--raft-addr", "0.0.0.0:7741", "--fast-lane-addr", "0.0.0.0:7742"]

# leasehold in a container, built FROM scratch: no base image is pulled. The binary is
# built first on the host, static and without cgo (`make image` does both steps):
#   CGO_ENABLED=0 go build -trimpath -o bin/leasehold ./cmd/leasehold
FROM scratch
COPY bin/leasehold /leasehold
VOLUME /data
EXPOSE 7740 7741
ENTRYPOINT ["/leasehold"]
# Open to whoever reaches the container's ports; give --auth-file and TLS flags
# instead of --insecure-no-auth to secure it (docs/SECURITY.md).
CMD ["server", "--addr", "0.0.0.0:7740", "--raft-addr", "0.0.0.0:7741", "--data-dir", "/data", "--insecure-no-auth"]

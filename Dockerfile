# syntax=docker/dockerfile:1
#
# nodelocaldns: a static Go binary on Debian bookworm-slim with both iptables
# backends. Build (BuildKit):
#
#   docker build -t registry.example.com/nodelocaldns:v0.1.0 \
#     --build-arg VERSION=v0.1.0 --build-arg REVISION=$(git rev-parse HEAD) .
#
# Several architectures: docker buildx build --platform linux/amd64,linux/arm64 ...
# The Go build cross-compiles on the build machine's platform.
# test/deploy/dockerfile_test.go checks this file and runs its go build.

# Keep in step with the go directive of go.mod (the test checks it).
ARG GO_VERSION=1.26.8

# The binary is static, so the build stage's distribution does not matter.
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH
WORKDIR /src
# Modules first: a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
# The whole context, .git included: go build stamps the commit (vcs.revision)
# and the version from its tag, which nodelocaldns_build_info reports.
COPY . .
# Static (no cgo: no libc to match), no build paths, no symbol tables.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -buildvcs=auto -trimpath -ldflags="-s -w" -o /out/nodelocaldns ./cmd/nodelocaldns

# The runtime: what the daemon runs besides itself is iptables-legacy,
# iptables-nft, ip6tables-legacy, ip6tables-nft and their -save commands
# (the backend is detected on the node at start). Debian's iptables package
# ships all of them; --no-install-recommends leaves out the nft CLI. They
# are dynamically linked and load their match and target extensions at run
# time, so copying them into a distroless image would mean tracking every
# library and extension by hand; this base gets them, and their fixes, from
# apt. (registry.k8s.io/build-image/distroless-iptables, kube-proxy's base,
# is the smaller alternative; not tried here.)
# --platform: BuildKit's default, spelled out for buildah 1.28, which
# otherwise keeps the build stage's platform for this one (test/image/build.sh
# passes BUILDPLATFORM and TARGETPLATFORM, which buildah 1.28 does not set).
FROM --platform=$TARGETPLATFORM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends iptables \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/nodelocaldns /nodelocaldns
# Declared after the apt-get layer: a build argument in scope is part of
# every later RUN's cache key, and the revision changes with every commit.
ARG VERSION=devel
ARG REVISION=unknown
LABEL org.opencontainers.image.title="nodelocaldns" \
      org.opencontainers.image.description="NodeLocal DNS cache for Kubernetes" \
      org.opencontainers.image.source="https://github.com/nodelocaldns/nodelocaldns" \
      org.opencontainers.image.documentation="https://github.com/nodelocaldns/nodelocaldns/blob/main/docs/deploy.md" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# Root: the link, the rules and port 53 need it; the DaemonSet drops every
# capability but NET_ADMIN, NET_RAW and NET_BIND_SERVICE.
USER 0:0
# Fixed: the DaemonSet passes flags as args, and its exec probes run
# "/nodelocaldns -probe ready|health".
ENTRYPOINT ["/nodelocaldns"]
